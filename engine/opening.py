"""Opening an engine's storage: the data directory's lock, the metadata store, the storage
record (where the log and batches live) and the blob store. A mixin of
:class:`sediment.engine.engine.Engine`, whose :meth:`~sediment.engine.engine.Engine.open`
calls these in order; the log itself is opened there (``_open_wal``), next to replay."""

from __future__ import annotations

from typing import Any

from sediment.engine.data_dir import StorageRecord, parse_wal, read_storage_record
from sediment.metadata.protocol import MetadataStore


class Opening:
    """The storage-opening steps of the Engine (mixin)."""

    def _take_lock(self) -> int:
        return self._dir.take_lock()

    def _open_metadata(self, metadata: str | MetadataStore | None) -> MetadataStore:
        if metadata is None:
            from sediment.metadata.journal import JournalMetadataStore

            return JournalMetadataStore(self._dir.meta)
        if isinstance(metadata, str):
            from sediment.metadata.open_store import open_metadata_store

            return open_metadata_store(metadata)
        return metadata

    def _storage_config(self, given: dict[str, Any]) -> StorageRecord:
        """Where this engine's log and batches live, as recorded when the data directory was
        created. Options left out are filled in from the record, so ``sediment read`` on a
        directory made with ``wal="device:..."`` or ``blob="s3://..."`` reads the same
        storage; an option that contradicts the record is refused rather than silently
        opening an empty log or store."""
        if given.get("wal") is not None:
            given["wal"] = parse_wal(given["wal"]).text
        recorded, version = read_storage_record(self._meta)
        merged = (recorded or StorageRecord()).merged(given, self.data_dir)
        if recorded is None or merged != recorded:  # recorded once the engine has opened with it
            self._record_storage = (merged.encode(), version)
        return merged

    def _open_blobs(self, blob: Any, s3_endpoint: str | None):
        if blob is None:
            blob = self._dir.default_blob_uri
        self.blob_uri = blob if isinstance(blob, str) else None
        self.s3_endpoint = s3_endpoint
        if isinstance(blob, str):
            from sediment.blob.uri import open_blob_store

            return open_blob_store(blob, s3_endpoint=s3_endpoint) if blob.startswith("s3://") else \
                open_blob_store(blob)
        return blob
