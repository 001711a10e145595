"""Where an S3-only cluster keeps its state, and its deployment record.

``s3://BUCKET/PREFIX[?endpoint=URL]`` names a cluster whose membership, assignment and
relations live in an S3 metadata store (``metadata/s3.py``) at that prefix. Its keys:

* ``config``: the deployment, written once by ``sediment cluster create``;
* ``member-seq``: the last member number handed out (compare-and-set), so ids order by age;
* ``members/m-<10 digits>``: each live member's lease (``metadata/lease.py``), renewed by it;
* ``leaving/<member>``: members stopping with SIGTERM;
* ``assignment``: partition -> (member, generation), compare-and-set on the key's version;
* ``relations/<name>``: each relation's partition, created once;
* ``partitions/<n>/...``: partition ``n``'s own S3 metadata store.

Every value is UTF-8 JSON with ``format`` and ``version`` (docs/formats.md). Partition
``n``'s log is the S3 log at ``<wal>/p<n>`` and its batches are under ``<blob>/p<n>``.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from sediment.cluster.layout import ClusterConfig
from sediment.errors import (
    ClusterExists,
    ClusterMissing,
    InvalidArgument,
    MetadataConflict,
    MetadataCorruption,
)

SCHEME = "s3://"
READERS = 8  # keys a pass reads at once (the S3 client keeps 10 connections)
VERSION = 1
MEMBER_DIGITS = 10


@dataclass(frozen=True)
class S3ClusterPath:
    """A parsed ``s3://BUCKET/PREFIX[?endpoint=URL]``."""

    bucket: str
    prefix: str
    endpoint: str | None

    @classmethod
    def parse(cls, uri: str) -> S3ClusterPath:
        from sediment.metadata.open_store import metadata_spec_problem

        if not isinstance(uri, str) or not uri.startswith(SCHEME):
            raise InvalidArgument(f"cluster URI {uri!r} must be s3://BUCKET/PREFIX[?endpoint=URL]")
        problem = metadata_spec_problem(uri)
        parts = urlsplit(uri)
        prefix = parts.path.strip("/")
        if problem is not None or not prefix:
            raise InvalidArgument(problem or f"cluster URI {uri!r} names no prefix: s3://BUCKET/PREFIX[?endpoint=URL]")
        return cls(parts.netloc, prefix, parse_qs(parts.query).get("endpoint", [None])[0])

    def spec(self, *parts: object) -> str:
        """The metadata spec of the store at this prefix (or below it, at ``parts``)."""
        path = "/".join([self.prefix, *(str(p) for p in parts)])
        endpoint = f"?endpoint={quote(self.endpoint, safe=':/')}" if self.endpoint else ""
        return f"{SCHEME}{self.bucket}/{path}{endpoint}"

    @property
    def uri(self) -> str:
        return self.spec()

    def partition_metadata(self, partition: int) -> str:
        return self.spec("partitions", partition)


def open_store(where: S3ClusterPath) -> Any:
    """The cluster's own metadata store, with short timeouts: a member must learn within a
    fraction of the lease time that S3 does not answer."""
    from sediment.metadata.s3 import S3MetadataStore

    return S3MetadataStore(where.bucket, where.prefix, where.endpoint, connect_timeout=2.0, read_timeout=3.0,
                           max_attempts=2)


def encode(kind: str, body: dict[str, Any]) -> bytes:
    return json.dumps({"format": f"sediment-{kind}", "version": VERSION, **body}, sort_keys=True).encode()


def decode(kind: str, data: bytes, key: str) -> dict[str, Any]:
    """A value written by :func:`encode`; MetadataCorruption naming the key otherwise."""
    try:
        body = json.loads(data)
        ok = isinstance(body, dict) and body.get("format") == f"sediment-{kind}" and body.get("version") == VERSION
    except ValueError:
        ok = False
    if not ok:
        raise MetadataCorruption(f"cluster key {key!r} does not hold a sediment-{kind} record of version {VERSION} "
                                 f"({bytes(data[:60])!r}); it was written by another program or version")
    return body


def member_id(seq: int) -> str:
    return f"m-{seq:0{MEMBER_DIGITS}d}"


def check_config(config: ClusterConfig) -> None:
    """An S3-only deployment: an S3 log and blob store, no storage nodes."""
    if not isinstance(config.partitions, int) or isinstance(config.partitions, bool) or not 1 <= config.partitions <= 4096:
        raise InvalidArgument(f"--partitions must be an integer in [1, 4096], not {config.partitions!r}")
    if config.replicas:
        raise InvalidArgument("an S3-only cluster (--metadata s3://...) has no storage nodes: leave --replicas out")
    if config.cluster_key:
        raise InvalidArgument("an S3-only cluster (--metadata s3://...) has no storage nodes, so no cluster key "
                              "(their key): leave it out")
    if not config.blob.startswith(SCHEME):
        raise InvalidArgument(f"an S3-only cluster keeps its batches in S3: --blob s3://bucket/prefix, not "
                              f"{config.blob!r}")
    if not (config.wal or "").startswith(SCHEME):
        raise InvalidArgument(f"an S3-only cluster's log is on S3: --wal s3://bucket/prefix, not {config.wal!r}")
    if not config.session_timeout > 0:
        raise InvalidArgument(f"--session-timeout must be positive seconds, not {config.session_timeout!r}")


def create(store: Any, where: S3ClusterPath, config: ClusterConfig) -> None:
    """Record the deployment once; ClusterExists if ``where`` already holds one."""
    check_config(config)
    try:
        store.compare_and_set("config", encode("cluster", {"config": asdict(config)}), None)
    except MetadataConflict:
        raise ClusterExists(f"{where.uri} already records a cluster; it is created once (use another prefix)") from None


def read_config(store: Any, where: S3ClusterPath) -> ClusterConfig:
    """The deployment record; ClusterMissing when there is none."""
    got = store.get("config")
    if got is None:
        raise ClusterMissing(f"no cluster at {where.uri}: create it first with `sediment cluster create "
                             f"--metadata '{where.uri}' ...`")
    return ClusterConfig(**decode("cluster", got.value, "config")["config"])


def get_all(store: Any, keys: list[str]) -> list[Any]:
    """Each key's value (None: gone), ``READERS`` at a time. Why: a member's control pass reads
    every member's and relation's key, each a few S3 requests; one after another they were
    about a second of an S3-only failover (docs/benchmarks.md, session 31)."""
    if len(keys) < 2:
        return [store.get(k) for k in keys]
    with ThreadPoolExecutor(min(READERS, len(keys)), "sediment-s3-cluster-read") as pool:
        return list(pool.map(store.get, keys))


def read_members(store: Any) -> dict[str, tuple[str, int, bytes]]:
    """Every member key present: id -> (advertised address, version, value)."""
    out = {}
    keys = store.list("members/")
    for key, got in zip(keys, get_all(store, keys), strict=True):
        if got is not None:
            out[key[len("members/"):]] = (decode("member", got.value, key)["advertise"], got.version, got.value)
    return out


def read_relations(store: Any) -> dict[str, int]:
    out = {}
    keys = store.list("relations/")
    for key, got in zip(keys, get_all(store, keys), strict=True):
        if got is not None:
            out[key[len("relations/"):]] = int(decode("relation", got.value, key)["partition"])
    return out


def read_assignment(store: Any) -> tuple[bytes, int | None]:
    """The assignment as ``layout.encode_assignment``'s bytes (``b""``: none yet) and its version."""
    from sediment.cluster.layout import encode_assignment

    got = store.get("assignment")
    if got is None:
        return b"", None
    raw = decode("assignment", got.value, "assignment")["assignment"]
    return encode_assignment({int(p): (str(m), int(g)) for p, (m, g) in raw.items()}), got.version


def read_view(store: Any, members: dict[str, str] | None = None, assignment: bytes | None = None) -> dict:
    """As ``layout.read_view``; ``members`` (id -> address) and ``assignment`` when the caller
    has just read them."""
    from sediment.cluster.layout import decode_assignment

    if members is None:
        members = {m: a for m, (a, _v, _b) in read_members(store).items()}
    data = read_assignment(store)[0] if assignment is None else assignment
    return {"members": dict(sorted(members.items())), "manager": min(members) if members else None,
            "assignment": decode_assignment(data), "relations": read_relations(store)}
