"""Opening an engine's storage: the data directory's lock, the metadata store, the storage
record (where the log and batches live) and the blob store. A mixin of
:class:`sediment.engine.engine.Engine`, whose :meth:`~sediment.engine.engine.Engine.open`
calls these in order; the log itself is opened there (``_open_wal``), next to replay."""

from __future__ import annotations

import fcntl
import os
from typing import Any

from sediment.errors import DataDirLocked, InvalidArgument, MetadataMissing
from sediment.metadata import names
from sediment.metadata.protocol import MetadataStore

LOCK_NAME = "LOCK"  # the data directory's lock file (flock), held while the engine is open
STORAGE_KEY = names.STORAGE


class Opening:
    """The storage-opening steps of the Engine (mixin)."""

    def _take_lock(self) -> int:
        path = os.path.join(self.data_dir, LOCK_NAME)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DataDirLocked(f"{self.data_dir} is in use by another sediment process (lock {path}); "
                                "stop it or use another --data-dir") from None
        return fd

    def _open_metadata(self, metadata: str | MetadataStore | None) -> MetadataStore:
        if metadata is None:
            from sediment.metadata.journal import JournalMetadataStore

            return JournalMetadataStore(os.path.join(self.data_dir, "meta"))
        if isinstance(metadata, str):
            from sediment.metadata.open_store import open_metadata_store

            return open_metadata_store(metadata)
        return metadata

    def _storage_config(self, given: dict[str, Any]) -> dict[str, Any]:
        """Where this engine's log and batches live, as recorded when the data directory was
        created. Options left out are filled in from the record, so ``sediment read`` on a
        directory made with ``wal="device:..."`` or ``blob="s3://..."`` reads the same
        storage; an option that contradicts the record is refused rather than silently
        opening an empty log or store."""
        import json

        wal = given.get("wal")
        if isinstance(wal, str) and wal.startswith("device:"):
            given["wal"] = "device:" + os.path.abspath(wal[len("device:"):])
        got = self._meta.get(STORAGE_KEY)
        recorded = json.loads(got.value) if got is not None else {}
        for key, value in given.items():
            if value is None or value == "<object>":
                continue
            if key in recorded and recorded[key] != value and key != "s3_endpoint":
                raise InvalidArgument(
                    f"{self.data_dir} was created with {key}={recorded[key]!r}, not {value!r}; open it with the "
                    f"same {key} (or leave it out: the recorded one is used)")
        merged = {**recorded, **{k: v for k, v in given.items() if v is not None and v != "<object>"}}
        if "engine_id" not in merged:  # this engine's identity: owner of its blob prefix (blob/owner.py)
            import uuid

            merged["engine_id"] = uuid.uuid4().hex
        if got is None or merged != recorded:  # recorded once the engine has opened with it
            self._record_storage = (json.dumps(merged, sort_keys=True).encode(), None if got is None else got.version)
        return merged

    def _open_blobs(self, blob: Any, s3_endpoint: str | None):
        if blob is None:
            blob = "file://" + os.path.join(self.data_dir, "blobs")
        self.blob_uri = blob if isinstance(blob, str) else None
        self.s3_endpoint = s3_endpoint
        if isinstance(blob, str):
            from sediment.blob.uri import open_blob_store

            return open_blob_store(blob, s3_endpoint=s3_endpoint) if blob.startswith("s3://") else \
                open_blob_store(blob)
        return blob

    def _check_meta_present(self) -> None:
        """A journal metadata directory that is gone while the log survives would open as a fresh,
        empty catalog over acknowledged data: refuse instead."""
        wal_dir = os.path.join(self.data_dir, "wal")
        if not os.path.isdir(os.path.join(self.data_dir, "meta")) and os.path.isdir(wal_dir) and os.listdir(wal_dir):
            raise MetadataMissing(f"{self.data_dir}: the metadata directory meta/ is missing while the write-ahead "
                                  f"log {wal_dir} exists; restore meta/ (opening would start an empty catalog)")
