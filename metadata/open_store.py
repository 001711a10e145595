"""Open a metadata store from a one-string spec (config files, the CLI's ``--metadata``)."""

from __future__ import annotations

import os
from typing import Any

from sediment.errors import InvalidMetadataRequest
from sediment.metadata.protocol import MetadataStore


def open_metadata_store(spec: str | os.PathLike[str], **options: Any) -> MetadataStore:
    """Open the store ``spec`` names.

    * ``zk://host:port[,host:port...]/root``: :class:`ZooKeeperMetadataStore` (root
      defaults to ``/sediment``); options such as ``timeout`` are passed through.
    * ``s3://bucket/prefix[?endpoint=http://host:port]``: :class:`S3MetadataStore` (the
      endpoint defaults to ``AWS_ENDPOINT_URL``, else AWS; ``sediment.open`` first adds its
      ``s3_endpoint`` to a spec that names none, see :func:`with_s3_endpoint`); options such
      as ``keep`` are passed through.
    * ``memory://``: a fresh :class:`MemoryMetadataStore`.
    * anything else: a local directory, opened as :class:`JournalMetadataStore`.
    """
    text = os.fspath(spec)
    problem = metadata_spec_problem(text)
    if problem is not None:
        raise InvalidMetadataRequest(problem)
    if text.startswith("zk://"):
        from sediment.metadata.zookeeper import ZooKeeperMetadataStore

        hosts, slash, root = text[len("zk://") :].partition("/")
        root = "/" + root if slash and root.strip("/") else "/sediment"
        return ZooKeeperMetadataStore(hosts, root, **options)
    if text.startswith("s3://"):
        return _open_s3(text, options)
    if text.startswith("memory://"):
        from sediment.metadata.memory import MemoryMetadataStore

        if options:
            raise InvalidMetadataRequest(f"memory:// takes no options, got {sorted(options)}")
        return MemoryMetadataStore()
    from sediment.metadata.journal import JournalMetadataStore

    return JournalMetadataStore(text, **options)


def _open_s3(text: str, options: dict[str, Any]) -> MetadataStore:
    from urllib.parse import parse_qs, unquote, urlsplit

    from sediment.metadata.s3 import S3MetadataStore

    parts = urlsplit(text)
    query = parse_qs(parts.query)
    if "endpoint" in query:
        options = {"endpoint_url": query["endpoint"][0], **options}
    return S3MetadataStore(parts.netloc, unquote(parts.path).strip("/"), **options)


def metadata_spec_problem(text: str) -> str | None:
    """What is wrong with the form of a metadata spec (None: nothing), without opening the
    store: ``sediment.open`` checks it before it creates anything."""
    if text.startswith("zk://"):
        if not text[len("zk://") :].partition("/")[0]:
            return f"metadata spec {text!r} names no ZooKeeper host; use zk://127.0.0.1:2181/sediment"
        return None
    if text.startswith("s3://"):
        from urllib.parse import parse_qs, urlsplit

        parts = urlsplit(text)
        query = parse_qs(parts.query)
        if not parts.netloc or set(query) - {"endpoint"} or len(query.get("endpoint", [""])) != 1:
            return (f"metadata spec {text!r} is not s3://bucket/prefix[?endpoint=http://host:port]; name a bucket "
                    "and at most one endpoint")
        if "endpoint" in query:
            return s3_endpoint_problem(query["endpoint"][0], "the endpoint of the metadata spec")
        return None
    if "://" in text and not text.startswith("memory://"):
        return (f"metadata spec {text!r} has an unknown scheme; use zk://host:port/root, s3://bucket/prefix, "
                "memory:// or a directory path")
    return None


def s3_endpoint_problem(endpoint: str, what: str) -> str | None:
    """What is wrong with an S3 endpoint URL (None: nothing): botocore takes only an
    ``http://`` or ``https://`` URL with a host, and refuses anything else with a bare
    ValueError once a store is being opened."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(endpoint)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018 - raises ValueError on a port that is no number
    except ValueError:
        ok = False
    if ok:
        return None
    return f"{what} {endpoint!r} is not an http:// or https:// URL with a host; use e.g. http://127.0.0.1:9000"


def with_s3_endpoint(spec: str, s3_endpoint: str | None) -> str:
    """``spec`` with ``?endpoint=`` set to ``s3_endpoint`` when it is an ``s3://`` spec that
    names no endpoint of its own: the engine's ``s3_endpoint`` reaches its metadata as it
    reaches its log and batches (an endpoint in the spec wins, as for ``wal=``)."""
    from urllib.parse import parse_qs, quote, urlsplit

    if not s3_endpoint or not spec.startswith("s3://") or "endpoint" in parse_qs(urlsplit(spec).query):
        return spec
    return f"{spec}{'&' if '?' in spec else '?'}endpoint={quote(s3_endpoint, safe=':/')}"
