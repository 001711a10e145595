"""Where a bulk load's staged files live (engine/staged.py): a directory of a file blob store,
or a key prefix of an S3 one.

Why two kinds: Spark writes Parquet only to file systems it has, and this build has no S3
one. With a file store, executors write with Spark's own writer straight into the store's
directory (on this machine or a shared file system). With an S3 store, they put one object
per task under the load's prefix themselves (spark_jobs/bulk_s3.py), so an S3-only cluster,
whose members share nothing but S3, takes bulk loads too; the commit then copies each object
into a spill file of the engine (its ``spill`` directory, swept at every open), checks it and
gives it its footer there, as it does a file store's file in place, and puts it under its
batch key. Either way the load's marker (:data:`MARKER`) says it was staged by this open.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

from sediment._fs import remove_tree_durable
from sediment.errors import InvalidArgument

MARKER = "_sediment-staged"  # in a load's directory (prefix) from stage() on: one without it was swept
Engine = Any  # sediment.engine.engine.Engine (an import would be a cycle)


def _local(blobs: Any) -> Callable[[str], Any] | None:
    return getattr(blobs, "local_path", None)


def open_area(engine: Engine, prefix: str) -> str:
    """Make load ``prefix``'s area with its marker; where its writers put Parquet files: a local
    directory (file blob store), or ``s3://BUCKET/KEYS/[?endpoint=URL]`` (S3 blob store)."""
    blobs = engine.traces.blobs
    local = _local(blobs)
    if local is not None:
        path = str(local(prefix.rstrip("/")))
        os.makedirs(path, exist_ok=True)
        open(os.path.join(path, MARKER), "ab").close()
        return path
    uri = getattr(engine, "blob_uri", None)
    if not isinstance(uri, str) or not uri.startswith("s3://"):
        raise InvalidArgument(f"bulk loads need a file or S3 blob store that the writers reach (this engine's is "
                              f"{blobs!r}); write without bulk")
    blobs.put(prefix + MARKER, b"")
    endpoint = getattr(engine, "s3_endpoint", None)
    return f"{uri.rstrip('/')}/{prefix}" + (f"?endpoint={quote(endpoint, safe=':/')}" if endpoint else "")


def marked(engine: Engine, prefix: str) -> bool:
    """Whether load ``prefix``'s area still has the marker :func:`open_area` put there."""
    blobs = engine.traces.blobs
    local = _local(blobs)
    if local is not None:
        return os.path.exists(os.path.join(str(local(prefix.rstrip("/"))), MARKER))
    return prefix + MARKER in blobs.list(prefix)


@contextlib.contextmanager
def local_files(engine: Engine) -> Iterator[Callable[[str], str]]:
    """``path_of(key)``: a staged object as a local file the commit may check and rewrite: the
    file store's own file, or a spill file holding a copy of the S3 object, deleted when the
    block ends (and by the next open's spill sweep after a crash)."""
    blobs = engine.traces.blobs
    local = _local(blobs)
    copies: list[str] = []
    lock = threading.Lock()

    def path_of(key: str) -> str:
        if local is not None:
            return str(local(key))
        path = engine.traces.spill_path()
        with lock:
            copies.append(path)
        with open(path, "wb") as f:
            f.write(blobs.get(key))
        return path

    try:
        yield path_of
    finally:
        for path in copies:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def put_file(blobs: Any, key: str, path: str) -> None:
    """Store the local file ``path`` as the new object ``key`` (linked into a file store)."""
    if _local(blobs) is not None:
        blobs.put_file(key, path, if_absent=True)
        return
    with open(path, "rb") as f:
        blobs.put_if_absent(key, f.read())


def remove(blobs: Any, prefix: str) -> tuple[int, list[str]]:
    """Delete everything under ``prefix`` (a load's area, a relation's, or all of ``staging/``),
    durably: (how many files or objects there were, the names directly under ``prefix``).

    In S3 the markers go first and the prefix is listed again after: a task still running
    looks for its load's marker after its PUT and deletes its object when the marker is gone
    (spark_jobs/bulk_s3.py), so an object is either in the second listing or deleted by its
    writer, never left behind by an abort, a commit's clean-up or a sweep."""
    local = _local(blobs)
    if local is None:
        keys = blobs.list(prefix)
        markers = [k for k in keys if k.rsplit("/", 1)[-1] == MARKER]
        for key in markers:
            blobs.delete(key)
        if markers:
            keys = sorted({*keys, *blobs.list(prefix)})
        for key in keys:
            if key not in markers:
                blobs.delete(key)
        return len(keys), sorted({k[len(prefix):].split("/", 1)[0] for k in keys})
    root = str(local(prefix.rstrip("/")))
    if not os.path.isdir(root):
        return 0, []
    files, names = sum(len(f) for _top, _dirs, f in os.walk(root)), sorted(os.listdir(root))
    remove_tree_durable(root)  # with a writer's own leftovers (_temporary/, .crc files)
    return files, names
