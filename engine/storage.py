"""What an open engine holds open: the data directory's lock, the metadata store, the blob
store and the write-ahead log, opened in that order and released in reverse by :meth:`close`
whichever of them an open got to.

Where each lives comes from the storage record (engine/data_dir.py): options left out are
filled in from it, so ``sediment read`` on a directory made with ``wal="device:..."`` or
``blob="s3://..."`` reads the same storage; an option that contradicts it is refused rather
than silently opening an empty log or store. The record is written once the open succeeded.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sediment.clock import Clock
from sediment.engine.data_dir import (
    STORAGE_KEY,
    DataDir,
    StorageRecord,
    WalSpec,
    parse_wal,
    read_storage_record,
)
from sediment.errors import InvalidArgument, MetadataMissing, WalCorruption
from sediment.metadata.protocol import MetadataStore
from sediment.wal.protocol import WriteAheadLog

_log = logging.getLogger(__name__)


def _refuse_other_logs_options(given: dict[str, Any], record: StorageRecord, root: str) -> None:
    """Options of a kind of log this engine does not use: they did nothing but were recorded,
    so a user who meant them got a log without them, and a later open giving another value was
    refused as contradicting the record of an option the log never used."""
    kind = "the replicated log" if record.replicas else f"the {record.wal_spec.kind} log"
    if given.get("wal_capacity") is not None and (record.replicas or record.wal_spec.kind != "device"):
        raise InvalidArgument(f"wal_capacity={given['wal_capacity']!r} sizes the ring of a device log "
                              f"(wal='device:PATH'), and {root} uses {kind}: leave it out (nothing was opened)")
    for option in ("cluster_key", "log_partition"):
        if given.get(option) is not None and not record.replicas:
            raise InvalidArgument(f"{option}={given[option]!r} belongs to a replicated log (replicas=[...]), and "
                                  f"{root} uses {kind}: leave it out, or give replicas=[...] too for a new engine "
                                  "(nothing was opened)")


@dataclass(eq=False)
class Storage:
    """The engine's stores, each None until opened."""

    dir: DataDir
    lock_fd: int | None = None
    meta: MetadataStore | None = None
    blobs: Any = None
    log: WriteAheadLog | None = None
    blob_uri: str | None = None
    s3_endpoint: str | None = None
    record: StorageRecord = field(default_factory=StorageRecord)
    _unsaved: tuple[bytes, int | None] | None = field(default=None, init=False, repr=False)
    _written: bytes | None = field(default=None, init=False, repr=False)  # the record this open wrote, if any
    created: bool = False  # this open made the storage record: a new log may be made
    recorded: bool = False  # this open wrote the storage record: from here on the directory is kept
    fresh: bool = False  # no engine had been made in the directory when this open took its lock

    def take_lock(self) -> None:
        self.lock_fd = self.dir.take_lock()
        self.fresh = not self.dir.holds_engine()

    def open_metadata(self, metadata: str | MetadataStore | None) -> MetadataStore:
        if metadata is None:
            from sediment.metadata.journal import JournalMetadataStore

            self.meta = JournalMetadataStore(self.dir.meta)
        elif isinstance(metadata, str):
            from sediment.metadata.open_store import open_metadata_store

            self.meta = open_metadata_store(metadata)
        else:
            self.meta = metadata
        return self.meta

    def settle_record(self, given: dict[str, Any]) -> StorageRecord:
        """The storage record with ``given`` (options, None where left out) filled in."""
        if given.get("wal") is not None:
            given["wal"] = parse_wal(given["wal"]).text
        recorded, version = read_storage_record(self.meta)
        self.created = recorded is None
        if recorded is not None and recorded.wal is None and not recorded.replicas and given.get("wal") not in (
                None, "file"):
            raise InvalidArgument(f"{self.dir.root} was created with the file log (wal='file'), not "
                                  f"wal={given['wal']!r}; open it with wal='file' (or leave wal out)")
        self.record = (recorded or StorageRecord()).merged(given, self.dir.root)
        _refuse_other_logs_options(given, self.record, self.dir.root)
        if recorded is None or self.record != recorded:  # recorded once the engine has opened with it
            self._unsaved = (self.record.encode(), version)
        return self.record

    def save_record(self) -> None:
        if self._unsaved is not None:
            self._written = self._unsaved[0]
            self.recorded = True  # set first: a write that fails may still have landed
            self.meta.compare_and_set(STORAGE_KEY, *self._unsaved)
            self._unsaved = None

    def created_elsewhere(self) -> bool:
        """After this creating open failed: whether another coordinator's storage record is
        there now (it created the same deployment at the same time). False for an open that
        found a record, and when the record cannot be read (nothing to conclude)."""
        if not self.created or self.meta is None:
            return False
        try:
            got = self.meta.get(STORAGE_KEY)
        except Exception:  # noqa: BLE001 - a store that fails now says nothing about a race
            return False
        return got is not None and got.value != self._written

    def open_blobs(self, blob: Any, wrap: Callable[[Any], Any]) -> Any:
        """The blob store ``blob`` names (None: the data directory's own), wrapped by ``wrap``."""
        if blob is None:
            blob = self.dir.default_blob_uri
        self.blob_uri = blob if isinstance(blob, str) else None
        self.s3_endpoint = self.record.s3_endpoint
        if isinstance(blob, str):
            from sediment.blob.uri import open_blob_store

            blob = open_blob_store(blob, s3_endpoint=self.s3_endpoint) if blob.startswith("s3://") else \
                open_blob_store(blob)
        self.blobs = wrap(blob)
        return self.blobs

    def open_local_log(self, spec: WalSpec, *, segment_bytes: int, repair: bool,
                       relation_names: Callable[[], dict[int, str]], clock: Clock) -> WriteAheadLog:
        """The file or device log (the device ring keeps its time on ``clock``). A new log is made only on the directory's first open (no
        storage record yet); later opens expect the log."""
        if spec.kind == "file":
            self.log = self._open_file_log(segment_bytes, repair, relation_names)
            return self.log
        from sediment.wal.device.log import DeviceLog  # the only other kind (data_dir.WAL_KINDS)

        capacity = self.record.wal_capacity
        if capacity is None and not os.path.exists(spec.location):
            raise InvalidArgument(f"{spec.text!r} does not exist yet: pass wal_capacity=<bytes> to create the ring")
        self.log = DeviceLog.open(spec.location, capacity, create=self.created, segment_bytes=segment_bytes,
                                  repair=repair, clock=clock)
        return self.log

    def _open_file_log(self, segment_bytes: int, repair: bool,
                       relation_names: Callable[[], dict[int, str]]) -> WriteAheadLog:
        from sediment.wal.file_log import FileLog

        try:
            log_ = FileLog.open(self.dir.wal, segment_bytes=segment_bytes, repair=repair, create=self.created,
                                keep_recovered=True)
        except WalCorruption as exc:  # name the relations whose records the lost range held
            if not getattr(exc, "problems", None):
                raise
            from sediment.wal.log_reader import refusal

            raise refusal(exc.directory, exc.problems, relation_names()) from None
        if self.created and log_.end_lsn > 0:
            log_.close()
            raise MetadataMissing(f"{self.dir.root}: the metadata has no storage record, but the write-ahead "
                                  f"log holds LSNs up to {log_.end_lsn - 1}: the metadata was lost or "
                                  "replaced; restore it (opening would lose every acknowledged update)")
        return log_

    def close(self) -> None:
        """Release whatever was opened (idempotent for the lock)."""
        for closer in (self.log, self.meta, self.blobs):
            if closer is not None:
                try:
                    closer.close()
                except Exception as exc:  # noqa: BLE001 - keep releasing the rest; the appends concerned got it too
                    _log.warning("closing %s: %s: %s", type(closer).__name__, type(exc).__name__, exc)
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None
