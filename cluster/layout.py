"""Where a cluster keeps its state in ZooKeeper, and the deployment record.

``zk://HOST:PORT/NAME`` names a cluster. Under ``/NAME``:

* ``config``: the deployment, recorded once by ``sediment cluster create`` (JSON: partitions,
  replicas, cluster key, blob URI, S3 endpoint, session timeout);
* ``members/m-<seq>``: one ephemeral sequential znode per live coordinator (JSON: its
  advertised address); the lowest sequence number is the manager;
* ``leaving/<member>``: members stopping with SIGTERM, whose partitions the manager moves first;
* ``assignment``: partition -> (member, generation), written by the manager with the
  znode's version as compare-and-set;
* ``relations/<name>``: the partition of each relation, created once at ``add_relation``;
* ``partitions/<n>/...``: partition ``n``'s own metadata store (catalog, trace state, the
  replicated log's partition record), opened as ``zk://HOST:PORT/NAME/partitions/<n>``.

Each partition's batches live under ``<blob>/p<n>`` and its log is partition ``n`` on the
storage nodes, so a partition is an engine of its own that any member can open.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import asdict, dataclass
from typing import Any

from sediment.errors import ClusterExists, ClusterMissing, InvalidArgument

DEFAULT_SESSION_TIMEOUT = 10.0
SCHEME = "zk://"


@dataclass(frozen=True)
class ClusterConfig:
    """The deployment record: what every member needs to open any partition."""

    partitions: int
    replicas: list[str]
    cluster_key: str
    blob: str
    s3_endpoint: str | None = None
    session_timeout: float = DEFAULT_SESSION_TIMEOUT
    wal: str | None = None  # an S3-only cluster's log prefix (cluster/s3_layout.py); None on ZooKeeper


@dataclass(frozen=True)
class ClusterPath:
    """A parsed ``zk://HOST:PORT[,HOST:PORT...]/NAME``."""

    hosts: str
    root: str

    @classmethod
    def parse(cls, uri: str) -> ClusterPath:
        if not isinstance(uri, str) or not uri.startswith(SCHEME):
            raise InvalidArgument(f"cluster URI {uri!r} must be zk://HOST:PORT/NAME")
        hosts, _slash, name = uri[len(SCHEME):].partition("/")
        name = name.strip("/")
        if not hosts or not name:
            raise InvalidArgument(f"cluster URI {uri!r} must name a ZooKeeper host and a cluster: zk://HOST:PORT/NAME")
        return cls(hosts, "/" + name)

    @property
    def uri(self) -> str:
        return f"{SCHEME}{self.hosts}{self.root}"

    def path(self, *parts: object) -> str:
        return "/".join([self.root, *(str(p) for p in parts)])

    def partition_metadata(self, partition: int) -> str:
        """The metadata spec of partition ``partition``'s engine."""
        return f"{SCHEME}{self.hosts}{self.path('partitions', partition)}"


def partition_blob(blob: str, partition: int) -> str:
    """Partition ``partition``'s blob prefix under the cluster's."""
    return f"{blob.rstrip('/')}/p{partition}"


def default_partition(name: str, partitions: int) -> int:
    """A relation's partition when ``add_relation`` names none: a stable hash of its name."""
    return zlib.crc32(name.encode()) % partitions


def check_config(config: ClusterConfig) -> None:
    """Bad input is refused before anything is recorded."""
    from sediment.engine.args import check_cluster_key, check_replicas

    if not isinstance(config.partitions, int) or isinstance(config.partitions, bool) or not 1 <= config.partitions <= 4096:
        raise InvalidArgument(f"--partitions must be an integer in [1, 4096], not {config.partitions!r}")
    check_replicas(config.replicas, "--replicas")
    if not config.cluster_key:
        raise InvalidArgument("--cluster-key is required: the storage nodes' cluster key")
    check_cluster_key(config.cluster_key, "--cluster-key")
    if not (config.blob.startswith("s3://") or config.blob.startswith("file://")):
        raise InvalidArgument(f"--blob must be s3://bucket/prefix or file:///shared/path every member reaches, "
                              f"not {config.blob!r}")
    if not config.session_timeout > 0:
        raise InvalidArgument(f"--session-timeout must be positive seconds, not {config.session_timeout!r}")


def create(zk: object, where: ClusterPath, config: ClusterConfig) -> None:
    """Record the deployment once; ClusterExists if ``where`` already holds one."""
    from kazoo.exceptions import NodeExistsError

    check_config(config)
    for part in ("members", "leaving", "relations", "partitions"):
        zk.ensure_path(where.path(part))
    try:
        record = {k: v for k, v in asdict(config).items() if k != "wal" or v is not None}
        zk.create(where.path("config"), json.dumps(record, sort_keys=True).encode())
    except NodeExistsError:
        raise ClusterExists(f"{where.uri} already records a cluster; it is created once (use another NAME)") from None


def read_config(zk: object, where: ClusterPath) -> ClusterConfig:
    """The deployment record; ClusterMissing when there is none."""
    from kazoo.exceptions import NoNodeError

    try:
        data, _stat = zk.get(where.path("config"))
    except NoNodeError:
        raise ClusterMissing(f"no cluster at {where.uri}: create it first with `sediment cluster create "
                             f"--metadata {where.uri} ...`") from None
    return ClusterConfig(**json.loads(data))


def decode_assignment(data: bytes | None) -> dict[int, tuple[str, int]]:
    """The assignment znode's JSON as partition -> (member, generation)."""
    if not data:
        return {}
    raw = json.loads(data)
    return {int(p): (str(m), int(g)) for p, (m, g) in raw.items()}


def encode_assignment(assignment: dict[int, tuple[str, int]]) -> bytes:
    return json.dumps({str(p): [m, g] for p, (m, g) in sorted(assignment.items())}).encode()


def connect_zk(where: ClusterPath, timeout: float = DEFAULT_SESSION_TIMEOUT) -> object:
    """A started kazoo client for the cluster's ZooKeeper, reconnecting at least once a second
    after an outage (the metadata store's retry), not kazoo's backoff of up to an hour."""
    from kazoo.client import KazooClient

    from sediment.errors import MetadataUnavailable
    from sediment.metadata.zookeeper import attempt_hosts, connection_retry, kazoo_logger

    logger, quiet = kazoo_logger()
    zk = KazooClient(hosts=attempt_hosts(where.hosts), timeout=timeout, connection_retry=connection_retry(),
                     logger=logger)
    _record_granted_timeout(zk)
    try:
        zk.start(timeout=max(timeout, 5.0))
    except Exception as exc:  # noqa: BLE001 - kazoo raises its own timeout type
        zk.close()
        raise MetadataUnavailable(f"cannot reach ZooKeeper at {where.hosts} ({exc}); is it running?") from None
    quiet.connected = True
    return zk


def _record_granted_timeout(zk: Any) -> None:
    """Keep on ``zk.granted_timeout`` (seconds) the session timeout ZooKeeper granted at each
    connect: it grants no more than its ``maxSessionTimeout``, so a member that counted on the
    timeout it asked for could go on serving after its session ended. kazoo negotiates it in
    its connection handler and keeps only the read timeout made from it (two thirds of it);
    where that handler is not as expected, nothing is recorded and the asked timeout holds."""
    conn = getattr(zk, "_connection", None)
    connect = getattr(conn, "_connect", None)
    if connect is None:
        return

    def connect_and_record(*args: Any) -> Any:
        got = connect(*args)
        try:
            zk.granted_timeout = float(got[0]) * 1.5 / 1000.0
        except (TypeError, ValueError, IndexError):
            pass
        return got

    conn._connect = connect_and_record


def granted_timeout(zk: Any, asked: float) -> float:
    """The session timeout ZooKeeper granted ``zk`` at its last connect, or ``asked`` when unknown."""
    got = getattr(zk, "granted_timeout", None)
    return got if isinstance(got, float) and got > 0 else asked


def read_view(zk: object, where: ClusterPath, timeout: float | None = None) -> dict:
    """What clients and ``cluster status`` need: members (id -> advertised address), the
    manager, the assignment and the relations' partitions. With ``timeout``, each read
    waits at most that long (kazoo's timeout error after it): kazoo holds a call while its
    connection is suspended, and a caller with a deadline must not wait for ZooKeeper's return."""
    from kazoo.exceptions import NoNodeError

    def children(path: str) -> list[str]:
        return zk.get_children_async(path).get(timeout=timeout)

    def get(path: str) -> bytes:
        return zk.get_async(path).get(timeout=timeout)[0]

    members: dict[str, str] = {}
    for child in sorted(children(where.path("members"))):
        try:
            data = get(where.path("members", child))
        except NoNodeError:
            continue
        members[child] = json.loads(data)["advertise"]
    try:
        data = get(where.path("assignment"))
    except NoNodeError:
        data = b""
    relations = {}
    for name in children(where.path("relations")):
        try:
            value = get(where.path("relations", name))
        except NoNodeError:
            continue
        relations[name] = int(value)
    return {"members": members, "manager": min(members) if members else None,
            "assignment": decode_assignment(data), "relations": relations}
