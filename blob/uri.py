"""Opening a blob store from the engine's ``blob=`` option.

Accepted values:

* ``memory://`` (private to the store) or ``memory://name`` (shared per name in-process);
* ``file:///abs/path`` or a plain path (relative paths resolve against the working directory);
* ``s3://bucket/prefix`` with options ``s3_endpoint``, ``s3_region``, ``s3_connect_timeout``,
  ``s3_read_timeout``, ``s3_max_attempts``, ``s3_multipart_threshold``, ``s3_part_size``,
  ``s3_multipart_concurrency`` and ``s3_addressing_style``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

from .file import FileBlobStore
from .memory import MemoryBlobStore
from .protocol import BlobStore

_S3_OPTIONS = {
    "s3_endpoint": "endpoint_url",
    "s3_region": "region",
    "s3_connect_timeout": "connect_timeout",
    "s3_read_timeout": "read_timeout",
    "s3_max_attempts": "max_attempts",
    "s3_multipart_threshold": "multipart_threshold",
    "s3_part_size": "part_size",
    "s3_multipart_concurrency": "multipart_concurrency",
    "s3_addressing_style": "addressing_style",
}


def open_blob_store(uri: str, **options: Any) -> BlobStore:
    """Build the store a URI names. Options that are None are ignored, so callers can pass
    every engine option through; options that do not apply to the scheme raise ValueError."""
    opts = {k: v for k, v in options.items() if v is not None}
    unknown = sorted(set(opts) - set(_S3_OPTIONS))
    if unknown:
        raise ValueError(f"unknown blob store option(s) {unknown}; known: {sorted(_S3_OPTIONS)}")
    problem = blob_uri_problem(uri)
    if problem is not None:
        raise ValueError(problem)
    if "://" not in uri:
        _no_options(uri, opts)
        return FileBlobStore(uri)
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme == "memory":
        _no_options(uri, opts)
        name = (parts.netloc + parts.path).strip("/")
        return MemoryBlobStore(name=name or None)
    if scheme == "file":
        _no_options(uri, opts)
        return FileBlobStore(unquote(parts.path))
    from .s3 import S3BlobStore  # noqa: PLC0415 - boto3 loads only for an S3 store (blob/__init__.py)

    kwargs = {_S3_OPTIONS[k]: v for k, v in opts.items()}
    return S3BlobStore(parts.netloc, prefix=unquote(parts.path).strip("/"), **kwargs)


def blob_uri_problem(uri: str) -> str | None:
    """What is wrong with the form of a ``blob=`` URI (None: nothing), without opening the
    store: ``sediment.open`` checks it before it creates anything."""
    if "://" not in uri:
        if not uri:
            return "blob store URI is empty; use memory://, file:///path, a path, or s3://bucket/prefix"
        return None
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            return (f"blob store URI {uri!r} names host {parts.netloc!r}; file URIs are local: use "
                    "file:///abs/path")
        if not parts.path:
            return f"blob store URI {uri!r} has no path; use file:///abs/path"
        return None
    if scheme == "s3" and not parts.netloc:
        return f"blob store URI {uri!r} has no bucket; use s3://bucket/prefix"
    if scheme not in ("memory", "file", "s3"):
        return (f"unknown blob store scheme {parts.scheme!r} in {uri!r}; use memory://, file:///path, "
                "a plain path, or s3://bucket/prefix")
    return None


def _no_options(uri: str, opts: dict[str, Any]) -> None:
    if opts:
        raise ValueError(f"options {sorted(opts)} apply only to s3:// blob stores, not {uri!r}")
