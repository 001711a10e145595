"""The data directory's one owner: its paths, the parsed ``wal=`` spec, the storage record,
the replicated marker, and the checks that open, verify and repair all run.

Why one module: each of these was built or parsed in several places (paths in seven, the
``wal=`` option in four), so a change to the layout had to be made everywhere at once and
verify had to repeat open's checks by hand. Layout in docs/formats.md ("Data directory").
"""

from __future__ import annotations

import json
import os
import struct
import uuid
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import crc32c

from sediment._fs import lock_file, replace_durably
from sediment.errors import (
    DataDirLocked,
    InvalidArgument,
    MetadataMissing,
    NotADataDir,
    SedimentError,
    StorageRecordMismatch,
    WalMissing,
)
from sediment.metadata import names
from sediment.metadata.protocol import MetadataStore

LOCK_NAME = "LOCK"  # flock'ed while an engine has the directory open
META_NAME = "meta"
WAL_NAME = "wal"
BLOBS_NAME = "blobs"
MARKER_NAME = "REPLICATED"
SERVER_NAME = "SERVER"  # while a process serves the directory: where it listens (sediment/cli/discover.py)
SERVER_FORMAT, SERVER_VERSION = "sediment-server", 1
MEMBER_NAME = "MEMBER"  # a cluster member's directory (sediment serve --cluster): names its cluster
MEMBER_FORMAT = "sediment-member"
STORAGE_KEY = names.STORAGE


def read_server_record(root: str) -> dict[str, Any] | None:
    """The ``SERVER`` record of the directory as written, or None if there is none or it is
    not one this version reads (docs/formats.md, "Server record")."""
    try:
        with open(os.path.join(root, SERVER_NAME), "rb") as f:
            record = json.loads(f.read())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("format") != SERVER_FORMAT \
            or record.get("version") != SERVER_VERSION or not isinstance(record.get("pid"), int) \
            or not isinstance(record.get("uri"), str):
        return None
    return record


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class DataDir:
    """Where each part of an engine's data directory lives (``root`` is absolute)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.lock, self.meta, self.wal, self.blobs, self.marker = (
            os.path.join(root, name) for name in (LOCK_NAME, META_NAME, WAL_NAME, BLOBS_NAME, MARKER_NAME))
        self.member = os.path.join(root, MEMBER_NAME)
        self.default_blob_uri = "file://" + self.blobs

    def take_lock(self) -> int:
        """The directory's exclusive lock (an open file descriptor); DataDirLocked if another process holds it."""
        fd = lock_file(self.lock)
        if fd is None:
            record = read_server_record(self.root)
            if record is not None and pid_alive(record["pid"]):
                uri = record["uri"]
                raise DataDirLocked(f"{self.root} is in use by process {record['pid']}, which serves it on {uri}: "
                                    f"reach the engine there (sediment.connect({uri!r}, token=...), or "
                                    f"sediment --connect {uri}), or stop that process first")
            raise DataDirLocked(f"{self.root} is in use by another sediment process (lock {self.lock}); "
                                "stop it or use another --data-dir")
        return fd

    def holds_engine(self) -> bool:
        """Whether an engine has been made here: its local metadata ``meta/``, its file log
        ``wal/``, or the marker of a replicated (or S3-log) engine, whose metadata is shared."""
        return os.path.isdir(self.meta) or os.path.isdir(self.wal) or os.path.isfile(self.marker)

    def member_of(self) -> str | None:
        """The cluster whose member keeps its partitions here (its ``MEMBER`` record), or None.
        A member's directory holds only its lock until its first partition opens, as an
        engine's does while its first open runs: the record is what tells them apart. A record
        that does not parse still marks a member's directory ("an unknown cluster")."""
        try:
            with open(self.member, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        try:
            record = json.loads(data)
            cluster = record["cluster"] if record.get("format") == MEMBER_FORMAT else None
        except (ValueError, AttributeError, KeyError):
            cluster = None
        return cluster if isinstance(cluster, str) else "an unknown cluster"

    def mark_member(self, cluster: str) -> None:
        """Durably record that a member of ``cluster`` keeps its partitions here (the lock held)."""
        if self.member_of() != cluster:
            record = {"format": MEMBER_FORMAT, "version": 1, "cluster": cluster}
            replace_durably(self.member, json.dumps(record, sort_keys=True).encode() + b"\n")

    def meta_missing(self) -> MetadataMissing | None:
        """Why opening would start an empty catalog over acknowledged data (a journal metadata
        directory gone while the log survives), or None: open raises it, verify reports it."""
        if not os.path.isdir(self.meta) and os.path.isdir(self.wal) and os.listdir(self.wal):
            return MetadataMissing(f"{self.root}: the metadata directory meta/ is missing while the write-ahead log "
                                   f"{self.wal} exists; restore meta/ (opening would start an empty catalog)")
        return None


# --- the wal= spec ---------------------------------------------------------------------------

@dataclass(frozen=True)
class WalSpec:
    """A parsed ``wal=`` option: its kind and, for kinds that have one, where it lives."""

    kind: str
    location: str | None = None

    @property
    def text(self) -> str:
        """The option as recorded in the storage record."""
        return self.kind if self.location is None else f"{self.kind}:{self.location}"


def _s3_spec(rest: str | None) -> WalSpec | None:
    """``s3://bucket/prefix[?endpoint=...]``: the location keeps the ``//``; a malformed one is
    refused by the log's own parser (InvalidArgument naming the form)."""
    if not rest or not rest.startswith("//"):
        return None
    from sediment.wal.s3_log import parse_spec

    parse_spec("s3:" + rest)
    return WalSpec("s3", rest)


# kind -> parser of what follows "kind:" (None when there is no colon); a parser returns None
# for a value it does not accept. A new kind of log is one more row.
WAL_KINDS: dict[str, Callable[[str | None], WalSpec | None]] = {
    "file": lambda rest: WalSpec("file") if rest is None else None,
    "device": lambda rest: WalSpec("device", os.path.abspath(rest)) if rest else None,
    "s3": _s3_spec,
}
WAL_USAGE = "use 'file', 'device:<path>' or 's3://bucket/prefix'"


def parse_wal(text: str | None) -> WalSpec:
    """The ``wal=`` option parsed (None: the default file log); InvalidArgument when unknown."""
    if text is None:
        return WalSpec("file")
    kind, colon, rest = text.partition(":")
    parser = WAL_KINDS.get(kind)
    spec = parser(rest if colon else None) if parser is not None else None
    if spec is None:
        raise InvalidArgument(f"unknown wal option {text!r}: {WAL_USAGE}")
    return spec


# --- the storage record ----------------------------------------------------------------------

@dataclass(frozen=True)
class StorageRecord:
    """Where an engine's log and batches live, kept in its metadata under ``engine/storage``
    (JSON with sorted keys, absent fields left out) so that an open leaving an option out
    finds the same storage, and one contradicting it is refused."""

    wal: str | None = None
    wal_capacity: int | None = None
    replicas: list[str] | None = None
    cluster_key: str | None = None
    log_partition: int | None = None  # the replicated log's partition on the storage nodes (cluster mode)
    blob: str | None = None
    s3_endpoint: str | None = None
    engine_id: str | None = None  # owner of its blob prefix (blob/owner.py)
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys of a newer version, kept as they are

    def as_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        return {**self.extra, **{k: v for k, v in out.items() if v is not None}}

    def encode(self) -> bytes:
        return json.dumps(self.as_dict(), sort_keys=True).encode()

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> StorageRecord:
        known = {f.name for f in fields(cls)} - {"extra"}
        return cls(**{k: v for k, v in raw.items() if k in known},
                   extra={k: v for k, v in raw.items() if k not in known})

    @classmethod
    def decode(cls, data: bytes) -> StorageRecord:
        """ValueError when ``data`` is not a JSON object."""
        raw = json.loads(data)
        if not isinstance(raw, dict):
            raise ValueError(f"a JSON object was expected, not {type(raw).__name__}")
        return cls.from_dict(raw)

    @property
    def wal_spec(self) -> WalSpec:
        return parse_wal(self.wal)

    def merged(self, given: Mapping[str, Any], where: str) -> StorageRecord:
        """This record with the options given filled in (None: not given); an option that
        contradicts the record is refused (the S3 endpoint may change), and an identity is
        made when there is none."""
        recorded = self.as_dict()
        for key, value in given.items():
            if value is not None and key in recorded and recorded[key] != value and key != "s3_endpoint":
                raise InvalidArgument(
                    f"{where} was created with {key}={recorded[key]!r}, not {value!r}; open it with the "
                    f"same {key} (or leave it out: the recorded one is used)")
        merged = {**recorded, **{k: v for k, v in given.items() if v is not None}}
        merged.setdefault("engine_id", uuid.uuid4().hex)
        return StorageRecord.from_dict(merged)


def read_storage_record(meta: Mapping[str, Any] | MetadataStore) -> tuple[StorageRecord | None, int | None]:
    """The recorded storage and its metadata version (None, None: not recorded yet)."""
    got = meta.get(STORAGE_KEY)
    if got is None:
        return None, None
    return StorageRecord.decode(got.value), got.version


# --- the replicated marker -------------------------------------------------------------------

MARKER_MAGIC = b"SDREPLIC"
MARKER_VERSION = 2  # 2: CRC32C, as every other checksum; 1 (zlib CRC-32) is still read
_MARKER_CRCS = {1: zlib.crc32, 2: crc32c.crc32c}
_HEAD = struct.Struct("<8sHH")  # magic, version, spec length; then the spec (UTF-8), then the CRC (u32 LE)


def encode_marker(spec: str) -> bytes:
    """The marker's bytes: magic, version, the metadata spec, CRC32C of all before it."""
    raw = spec.encode()
    if len(raw) > 0xFFFF:
        raise StorageRecordMismatch(f"metadata spec of {len(raw)} bytes is too long for the data-dir marker")
    body = _HEAD.pack(MARKER_MAGIC, MARKER_VERSION, len(raw)) + raw
    return body + struct.pack("<I", crc32c.crc32c(body))


def decode_marker(data: bytes, where: str = MARKER_NAME) -> str:
    """The metadata spec a marker names; StorageRecordMismatch if it is not a valid marker."""
    if len(data) < _HEAD.size + 4:
        raise StorageRecordMismatch(f"{where}: {len(data)} bytes is too short for a replicated-engine marker; "
                                    "restore it (it names the metadata store, e.g. zk://host:port/root)")
    magic, version, n = _HEAD.unpack_from(data)
    if magic != MARKER_MAGIC or version not in _MARKER_CRCS or len(data) != _HEAD.size + n + 4:
        raise StorageRecordMismatch(f"{where}: not a version-1 or -{MARKER_VERSION} replicated-engine marker "
                                    f"(magic {magic!r}, version {version}, {len(data)} bytes)")
    (crc,) = struct.unpack_from("<I", data, _HEAD.size + n)
    if _MARKER_CRCS[version](data[:_HEAD.size + n]) != crc:
        raise StorageRecordMismatch(f"{where}: checksum mismatch at offset {_HEAD.size + n}; the marker is "
                                    "damaged: restore it or rewrite it by opening the engine with metadata=")
    return data[_HEAD.size:_HEAD.size + n].decode()


def read_marker(data_dir: str) -> str | None:
    """The metadata spec of a replicated engine's data directory, or None (not replicated)."""
    path = DataDir(data_dir).marker
    try:
        with open(path, "rb") as f:
            return decode_marker(f.read(), path)
    except FileNotFoundError:
        return None


def write_marker(data_dir: str, spec: str) -> None:
    """Durably record that ``data_dir`` belongs to the replicated engine whose metadata is ``spec``."""
    replace_durably(DataDir(data_dir).marker, encode_marker(spec))


def check_not_member(data_dir: str) -> None:
    """Before anything is created: an engine is never made in a cluster member's directory,
    where it would sit beside the member's partitions and stop the member from starting again."""
    cluster = DataDir(data_dir).member_of()
    if cluster is not None:
        raise NotADataDir(f"{data_dir} is a cluster member's directory (a member of {cluster}: its MEMBER record "
                          f"says so), not an engine's; nothing was created: reach the cluster (sediment --connect "
                          f"{cluster}) or use another directory")


OWN_NAMES = frozenset({LOCK_NAME, META_NAME, WAL_NAME, BLOBS_NAME, MARKER_NAME, SERVER_NAME, "spill"})


def foreign_entries(root: str) -> list[str]:
    """What a directory holds that no engine makes in its data directory, sorted. A record's
    temporary file (``NAME.<pid>.tmp``) and a repair report are an engine's own; ``lost+found``
    is the file system's, at the top of a volume mounted for the data."""
    try:
        entries = os.listdir(root)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(n for n in entries if n.split(".", 1)[0] not in OWN_NAMES and n != "lost+found"
                  and not n.startswith("repair-"))


def foreign_dir_problem(data_dir: str) -> str | None:
    """Why ``data_dir`` is no engine's and may not become one, or None: it holds no engine and
    files of someone else's (a home or project directory given by mistake)."""
    if not os.path.isdir(data_dir) or DataDir(data_dir).holds_engine():
        return None
    foreign = foreign_entries(data_dir)
    if not foreign:
        return None
    shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
    return (f"{data_dir} is not a sediment data directory: it holds {shown} and no engine (none of meta/, wal/, "
            "REPLICATED)")


def check_marker(data_dir: str, metadata: object) -> str | None:
    """Before anything is created: a replicated engine's directory needs its metadata store,
    the one given or else the one its marker names. Returns the marker's spec (None: not a
    replicated engine's directory)."""
    spec = read_marker(data_dir)
    if spec is not None and metadata is None and spec.startswith("<"):
        raise StorageRecordMismatch(
            f"{data_dir} belongs to a replicated engine whose metadata store is {spec!r} (marker "
            f"{DataDir(data_dir).marker}); open it with metadata={spec!r}")
    return spec


# --- checks open and verify share ------------------------------------------------------------

def traces_past_log(where: str, end_lsn: int, traces: Iterable[tuple[str, int]]) -> list[WalMissing]:
    """A trace that took the log's records up to ``wal_through`` proves the log reached that
    LSN; a log that ends before it was replaced or lost its tail. One error per such relation
    (``traces``: relation name, its trace's ``wal_through``): open raises the first, verify
    reports them all."""
    return [WalMissing(f"{where}: relation {name!r} has the log's records up to LSN {through} in its trace, but "
                       f"the write-ahead log ends at LSN {end_lsn}: the log lost its end or was replaced. Restore it",
                       reason="log behind trace", first_lsn=end_lsn, last_lsn=through - 1)
            for name, through in traces if through > end_lsn]


def trace_ends(meta: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(relation name, its trace's ``wal_through``) for each relation of a metadata snapshot's
    catalog, as :func:`traces_past_log` takes them; entries that do not decode are left to
    the trace checks."""
    from sediment.engine.catalog import RELATIONS, RelationEntry
    from sediment.trace.state import TraceState
    from sediment.trace.store import state_key

    ends = []
    for key, value in meta.items():
        if key.startswith(RELATIONS):
            try:
                entry = RelationEntry.decode(value.value, value.version, key)
                raw = meta.get(state_key(entry.id))
                ends.append((entry.name, TraceState.decode(raw.value).wal_through if raw is not None else 0))
            except SedimentError:
                continue
    return ends
