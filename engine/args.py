"""Argument checks for the Engine's public calls and ``sediment.open``'s options.

Every check runs before anything is written (or, for ``open``, before the data
directory is created), so a refused call leaves no trace. Each raises
:class:`sediment.errors.InvalidArgument` (or :class:`~sediment.errors.InvalidTime`)
with one line saying which argument is wrong and what is allowed. Conversions are
never guessed: ``True`` is not the time 1, ``"7"`` is not 7, ``7.0`` is not 7.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

from sediment.blob.uri import blob_uri_problem
from sediment.engine.data_dir import parse_wal
from sediment.engine.memory import POOLS
from sediment.errors import InvalidArgument, InvalidTime
from sediment.metadata.open_store import metadata_spec_problem, s3_endpoint_problem

MAX_TIME = (1 << 63) - 1


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_time(t: object, what: str) -> int:
    """``t`` if it is an int in ``[0, 2**63)``; else InvalidTime naming ``what``."""
    if not _is_int(t) or not 0 <= t <= MAX_TIME:
        kind = "" if _is_int(t) else f" ({type(t).__name__})"
        raise InvalidTime(f"{what} must be an integer time in [0, 2**63), not {t!r}{kind}")
    return int(t)


def check_optional_time(t: object, what: str) -> int | None:
    return None if t is None else check_time(t, what)


def check_int(value: object, what: str, *, low: int = 1, high: int | None = None) -> int:
    """An int in ``[low, high]`` (bools refused)."""
    if not _is_int(value) or value < low or (high is not None and value > high):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise InvalidArgument(f"{what} must be an integer {bound}, not {value!r}")
    return int(value)


def check_bool(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{what} must be True or False, not {value!r}")
    return value


def check_number(value: object, what: str, *, low: float = 0.0, low_open: bool = True,
                 allow_none: bool = False) -> float | None:
    """A finite int or float above ``low`` (or at least it, when not ``low_open``)."""
    if value is None and allow_none:
        return None
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
          and (value > low if low_open else value >= low))
    if not ok:
        rel = ">" if low_open else ">="
        extra = " or None" if allow_none else ""
        raise InvalidArgument(f"{what} must be a finite number {rel} {low}{extra}, not {value!r}")
    return value


def check_str(value: object, what: str, *, allow_none: bool = True) -> str | None:
    if value is None and allow_none:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{what} must be a non-empty string{' or None' if allow_none else ''}, not {value!r}")
    return value


def _directory_or_creatable(path: str, what: str) -> None:
    """InvalidArgument unless ``path`` is a directory, or the nearest of it and its parents
    that exists is one (so that it can be created)."""
    probe = os.path.abspath(path)
    while not os.path.isdir(probe):
        if os.path.lexists(probe):
            raise InvalidArgument(f"{what} {path!r}: {probe} exists and is not a directory; pass a directory, or "
                                  "a path where one can be created")
        parent = os.path.dirname(probe)
        if parent == probe:
            return
        probe = parent


def check_data_dir(data_dir: object) -> str:
    if not isinstance(data_dir, (str, os.PathLike)) or not os.fspath(data_dir):
        raise InvalidArgument(f"the data directory must be a non-empty path (str or os.PathLike), not {data_dir!r}")
    path = os.fspath(data_dir)
    if not isinstance(path, str) or "\0" in path:
        raise InvalidArgument(f"the data directory must be a text path without NUL bytes, not {data_dir!r}")
    _directory_or_creatable(path, "the data directory")
    return path


def check_replicas(replicas: object, what: str) -> list[str]:
    """Storage nodes as distinct ``HOST:PORT`` strings. A malformed one failed inside the log's
    connection task (an internal error), and one named twice counted twice towards a write
    quorum that then held fewer copies than it claimed."""
    if isinstance(replicas, (str, bytes)) or not isinstance(replicas, (list, tuple)) or not replicas:
        raise InvalidArgument(f"{what} must be a list of storage nodes as 'host:port' strings, not {replicas!r}")
    seen: set[str] = set()
    for r in replicas:
        host, sep, port = r.rpartition(":") if isinstance(r, str) else ("", "", "")
        if not sep or not host.strip() or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise InvalidArgument(f"{what}: {r!r} is not a storage node's HOST:PORT (a port in 1..65535), "
                                  "e.g. 127.0.0.1:7001")
        if r in seen:
            raise InvalidArgument(f"{what} names storage node {r} twice: a write quorum counts each node once; "
                                  "give every node once")
        seen.add(r)
    return list(replicas)


def check_cluster_key(key: object, what: str) -> str:
    """The storage nodes' cluster key: a UUID (``sediment cluster-key`` prints a new one)."""
    import uuid

    if isinstance(key, uuid.UUID):
        return str(key)
    try:
        uuid.UUID(key if isinstance(key, str) else "")
    except ValueError:
        raise InvalidArgument(f"{what} {key!r} is not a UUID: give the key the storage nodes were started "
                              "with (`sediment cluster-key` prints a new one)") from None
    return key


def check_open_options(options: Mapping[str, Any]) -> None:
    """The Engine's constructor options, checked before the data directory is touched."""
    o = options
    wal = check_str(o.get("wal"), "wal")
    if wal is not None and parse_wal(wal).kind == "s3" and o.get("metadata") is None:
        raise InvalidArgument("wal='s3://...' needs a metadata store every coordinator can reach, e.g. "
                              "metadata='s3://bucket/meta'")
    if o.get("wal_capacity") is not None:
        check_int(o["wal_capacity"], "wal_capacity", low=1)
    replicas = o.get("replicas")
    if replicas is not None and not (isinstance(replicas, (list, tuple)) and not replicas):
        check_replicas(replicas, "replicas")
    if replicas and o.get("metadata") is None:
        raise InvalidArgument("replicas=[...] needs a shared metadata store, e.g. "
                              "metadata='zk://127.0.0.1:2181/sediment'")
    if o.get("cluster_key") is not None:
        check_cluster_key(o["cluster_key"], "cluster_key")
    if o.get("log_partition") is not None:
        check_int(o["log_partition"], "log_partition (the replicated log's partition on the storage nodes)", low=0)
    check_int(o.get("segment_bytes", 1), "segment_bytes", low=4096)
    check_int(o.get("max_record_bytes", 1 << 20), "max_record_bytes", low=1)
    metadata = o.get("metadata")
    if metadata is not None and not isinstance(metadata, str) and not hasattr(metadata, "compare_and_set"):
        raise InvalidArgument(f"metadata must be a spec such as 'zk://127.0.0.1:2181/sediment' or a MetadataStore, "
                              f"not {type(metadata).__name__}")
    if isinstance(metadata, str):
        check_str(metadata, "metadata")
        problem = metadata_spec_problem(metadata)
        if problem is not None:
            raise InvalidArgument(f"metadata={metadata!r}: {problem}")
        if "://" not in metadata:  # a local metadata directory
            _directory_or_creatable(metadata, "metadata")
    blob = o.get("blob")
    if blob is not None and not isinstance(blob, str) and not hasattr(blob, "put"):
        raise InvalidArgument(f"blob must be a URI ('file:///path', 'memory://', 's3://bucket/prefix') or a blob "
                              f"store, not {type(blob).__name__}")
    if isinstance(blob, str):
        check_str(blob, "blob")
        problem = blob_uri_problem(blob)
        if problem is not None:
            raise InvalidArgument(f"blob={blob!r}: {problem}")
    s3_endpoint = check_str(o.get("s3_endpoint"), "s3_endpoint")
    problem = s3_endpoint_problem(s3_endpoint, "s3_endpoint") if s3_endpoint is not None else None
    if problem is not None:
        raise InvalidArgument(problem)
    check_number(o.get("compact_interval"), "compact_interval", allow_none=True)
    check_bool(o.get("compact", True), "compact")
    merge_factor = check_number(o.get("merge_factor", 2.0), "merge_factor")
    if merge_factor is not None and merge_factor < 1.0:
        raise InvalidArgument(f"merge_factor must be a finite number >= 1.0, not {merge_factor!r}")
    check_int(o.get("memory_bound", 1 << 20), "memory_bound", low=1)
    check_int(o.get("lock_slots", 1), "lock_slots", low=1)
    pool = o.get("arrow_memory_pool")
    if pool is not None and pool not in POOLS:
        raise InvalidArgument(f"arrow_memory_pool must be one of {sorted(POOLS)} or None, not {pool!r}")
    check_bool(o.get("take_over_blob_prefix", False), "take_over_blob_prefix")
    clock = o.get("clock")
    if clock is not None and not callable(getattr(clock, "current_time", None)):
        raise InvalidArgument(f"clock must be a sediment.clock.Clock (an object with current_time() -> seconds, "
                              f"e.g. sediment.clock.ManualClock()) or None, not {clock!r}")
    check_bool(o.get("repair", False), "repair")
    if o.get("max_wal_backlog") is not None:
        check_int(o["max_wal_backlog"], "max_wal_backlog (bytes of WAL not yet compacted, or None: unbounded)",
                  low=1 << 20)
    check_number(o.get("wal_backlog_timeout", 60.0), "wal_backlog_timeout (seconds)", low_open=False)
    check_number(o.get("major_compaction_quiet"), "major_compaction_quiet (seconds, or None: only compact())",
                 allow_none=True, low_open=False)


def check_locks(locks: object) -> None:
    from sediment.engine.locks import Locks

    if locks is not None and not isinstance(locks, Locks):
        raise InvalidArgument(f"locks must be a sediment.Locks or None, not {type(locks).__name__}")


def check_updates_map(updates: object) -> None:
    """``append_many``'s argument: relation name -> table (the tables are checked later)."""
    if not isinstance(updates, Mapping):
        raise InvalidArgument(f"append_many takes a mapping of relation name -> pyarrow.Table, e.g. "
                              f"{{'orders': table}}, not {type(updates).__name__}; call append(name, table) for one")
