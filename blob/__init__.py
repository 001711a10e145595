"""Blob stores: immutable objects under string keys (memory, local files, S3)."""

from .file import FileBlobStore
from .memory import MemoryBlobStore
from .protocol import BlobStore
from .s3 import S3BlobStore
from .uri import open_blob_store

__all__ = ["BlobStore", "FileBlobStore", "MemoryBlobStore", "S3BlobStore", "open_blob_store"]
