"""Blob stores: immutable objects under string keys (memory, local files, S3).

``S3BlobStore`` is loaded on first use: boto3 and botocore take about a quarter of a
second to import, which every ``sediment.open`` of a local engine and every CLI command
would otherwise pay.
"""

from __future__ import annotations

import importlib
from typing import Any

from .file import FileBlobStore
from .memory import MemoryBlobStore
from .protocol import BlobStore
from .uri import open_blob_store

__all__ = ["BlobStore", "FileBlobStore", "MemoryBlobStore", "S3BlobStore", "open_blob_store"]


def __getattr__(name: str) -> Any:
    if name == "S3BlobStore":
        return importlib.import_module("sediment.blob.s3").S3BlobStore
    raise AttributeError(f"module 'sediment.blob' has no attribute {name!r}")
