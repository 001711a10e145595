"""A replicated engine as a real deployment: what any coordinator needs to take over.

Three rules, all checked before anything is created:

* Batches must live where every coordinator can reach them: ``blob="s3://..."``, or a
  ``file://`` path given explicitly (a shared mount). The default ``<data-dir>/blobs``
  is refused, since a coordinator replacing this one on another machine (or another
  data directory) would find the trace's batches missing.
* The storage record (log kind, replicas, cluster key, blob URI) lives in the metadata
  store (the engine's ``engine/storage`` key), so ``metadata=`` alone opens the engine.
* The data directory says it belongs to a replicated engine: a small durable marker
  file, ``REPLICATED``, names the metadata store. Opening the directory without
  ``metadata=`` opens that store (so later opens and CLI commands need not repeat it),
  never an empty local engine; a marker naming a store object given in Python
  (``<ClassName>``) cannot be reopened from its name and is refused (StorageRecordMismatch). Format in docs/formats.md ("Replicated data directory marker").

A coordinator fenced by a newer one closes its engine (:func:`close_when_fenced`); the
reason is kept in ``engine.superseded`` and ``sediment serve`` exits non-zero with it.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import threading
import zlib
from collections.abc import Callable
from typing import Any

from sediment._fs import replace_durably
from sediment.errors import CoordinatorSuperseded, StorageRecordMismatch

MARKER_NAME = "REPLICATED"
MARKER_MAGIC = b"SDREPLIC"
MARKER_VERSION = 1
_HEAD = struct.Struct("<8sHH")  # magic, version, spec length; then the spec (UTF-8), then CRC-32 (u32 LE)
log = logging.getLogger(__name__)


def encode_marker(spec: str) -> bytes:
    """The marker's bytes: magic, version, the metadata spec, CRC-32 of all before it."""
    raw = spec.encode()
    if len(raw) > 0xFFFF:
        raise StorageRecordMismatch(f"metadata spec of {len(raw)} bytes is too long for the data-dir marker")
    body = _HEAD.pack(MARKER_MAGIC, MARKER_VERSION, len(raw)) + raw
    return body + struct.pack("<I", zlib.crc32(body))


def decode_marker(data: bytes, where: str = MARKER_NAME) -> str:
    """The metadata spec a marker names; StorageRecordMismatch if it is not a valid marker."""
    if len(data) < _HEAD.size + 4:
        raise StorageRecordMismatch(f"{where}: {len(data)} bytes is too short for a replicated-engine marker; "
                                    "restore it (it names the metadata store, e.g. zk://host:port/root)")
    magic, version, n = _HEAD.unpack_from(data)
    if magic != MARKER_MAGIC or version != MARKER_VERSION or len(data) != _HEAD.size + n + 4:
        raise StorageRecordMismatch(f"{where}: not a version-{MARKER_VERSION} replicated-engine marker "
                                    f"(magic {magic!r}, version {version}, {len(data)} bytes)")
    (crc,) = struct.unpack_from("<I", data, _HEAD.size + n)
    if zlib.crc32(data[:_HEAD.size + n]) != crc:
        raise StorageRecordMismatch(f"{where}: checksum mismatch at offset {_HEAD.size + n}; the marker is "
                                    "damaged: restore it or rewrite it by opening the engine with metadata=")
    return data[_HEAD.size:_HEAD.size + n].decode()


def read_marker(data_dir: str) -> str | None:
    """The metadata spec of a replicated engine's data directory, or None (not replicated)."""
    path = os.path.join(data_dir, MARKER_NAME)
    try:
        with open(path, "rb") as f:
            return decode_marker(f.read(), path)
    except FileNotFoundError:
        return None


def write_marker(data_dir: str, spec: str) -> None:
    """Durably record that ``data_dir`` belongs to the replicated engine whose metadata is ``spec``."""
    replace_durably(os.path.join(data_dir, MARKER_NAME), encode_marker(spec))


def check_opening(data_dir: str, metadata: object) -> str | None:
    """Before anything is created: a replicated engine's directory needs its metadata store,
    the one given or else the one its marker names. Returns the marker's spec (None: not a
    replicated engine's directory)."""
    spec = read_marker(data_dir)
    if spec is not None and metadata is None and spec.startswith("<"):
        raise StorageRecordMismatch(
            f"{data_dir} belongs to a replicated engine whose metadata store is {spec!r} (marker "
            f"{os.path.join(data_dir, MARKER_NAME)}); open it with metadata={spec!r}")
    return spec


def metadata_spec(metadata: object) -> str:
    """How to name the metadata store in the marker."""
    if isinstance(metadata, str):
        return metadata
    hosts, root = getattr(metadata, "hosts", None), getattr(metadata, "root", None)
    if hosts and root:
        return f"zk://{hosts}{root}"
    return f"<{type(metadata).__name__}>"


def owner_name(data_dir: str) -> str:
    """How this coordinator is named in the partition metadata: what the one it replaces
    reports as the new owner (host, process id, data directory)."""
    return f"{socket.gethostname()} pid {os.getpid()} {data_dir}"


def require_shared_blob(blob: object, data_dir: str) -> None:
    """Replicated mode: the batches must be reachable by every coordinator, so the blob
    store must be named (given now, or recorded when the engine was created)."""
    if isinstance(blob, str) and (blob.startswith("s3://") or blob.startswith("file://")):
        return
    if blob is not None and not isinstance(blob, str):
        return  # a store object: the caller built it, and vouches for where it lives
    raise StorageRecordMismatch(
        f"{data_dir}: a replicated engine needs a blob store every coordinator can reach, not "
        f"{blob or 'the local default ' + os.path.join(data_dir, 'blobs')!r}: pass blob='s3://bucket/prefix' "
        "(with s3_endpoint= if not AWS) or blob='file:///shared/mount/path' on storage all coordinators share")


def close_when_fenced(engine: Any, on_fenced: Callable[[Callable[[BaseException], None]], None]) -> None:
    """When the log is fenced by a newer coordinator, close the engine (in a thread of its own,
    as the log's thread must not wait for itself) and tell ``engine.superseded_listeners``."""

    def fenced(err: BaseException) -> None:
        engine.superseded = CoordinatorSuperseded(
            f"the coordinator on {engine.data_dir} was superseded ({err}); its engine was closed: stop this "
            "process, the new coordinator serves the data")
        log.error("%s", engine.superseded)

        def close_and_tell() -> None:
            try:
                engine.close()
            finally:
                for callback in list(engine.superseded_listeners):
                    callback(engine.superseded)

        threading.Thread(target=close_and_tell, name="close-superseded", daemon=True).start()

    on_fenced(fenced)
