"""What a cluster member needs of the store that keeps the cluster's membership.

:class:`~sediment.cluster.member.Member` runs the same control loop whatever keeps the
membership; this protocol is everything it asks of that store, so that ZooKeeper (ephemeral
sequential znodes and watches, ``cluster/zk_membership.py``) and S3 alone (leases renewed by
their holders and polled, ``cluster/s3_membership.py``) are interchangeable. Neither is
what keeps a partition safe: that is the fence of the partition's log (the storage nodes'
store session, the S3 log's epoch claim), which a new owner's open takes.

Connection states are reported to the member as ZooKeeper names them: ``"CONNECTED"``,
``"SUSPENDED"`` (out of touch: stop serving, the membership may come back) and ``"LOST"``
(this member is out of the cluster: close everything and register anew once connected).
Calls a client's request waits on are bounded: one that gets no answer in time raises
:class:`CallUnanswered`, which the member turns into a redirect or an unknown outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from sediment.cluster.layout import ClusterConfig

CONNECTED, SUSPENDED, LOST = "CONNECTED", "SUSPENDED", "LOST"


class CallUnanswered(Exception):  # noqa: N818 - internal: the member turns it into a typed error
    """A membership call sent but not answered in time (``why``); a write may yet be applied."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class Membership(Protocol):
    """The membership store of one cluster, as one member (or a client) sees it."""

    uri: str
    store: str  # how messages name it: "ZooKeeper", "the S3 metadata store"
    tie: str  # what a member holds there, as messages name it: "ZooKeeper session", "S3 lease"

    def start(self, on_state: Callable[[str], None]) -> ClusterConfig:
        """Connect, read the deployment record (ClusterMissing if none) and report state changes."""
        ...

    def stop(self) -> None:
        """Leave: end the session (or give up the lease) so the others need not wait it out."""
        ...

    def register(self, advertise: str) -> str:
        """Join as a new member advertised at ``advertise``; its id. Ids order members by age."""
        ...

    def members(self, wake: Callable[[], None]) -> list[str]:
        """The live members' ids; ``wake`` is called when they may have changed."""
        ...

    def remove(self, member: str) -> None:
        """Take ``member`` out of the members (its port refused a connection)."""
        ...

    def leaving(self, wake: Callable[[], None]) -> list[str]:
        """The members that announced they are stopping."""
        ...

    def announce_leaving(self, member: str) -> None:
        """Record that ``member`` is stopping (bounded: CallUnanswered)."""
        ...

    def read_assignment(self, wake: Callable[[], None]) -> tuple[bytes, Any]:
        """The assignment (``layout.encode_assignment``'s bytes, ``b""`` if none) and its version."""
        ...

    def write_assignment(self, data: bytes, version: Any) -> bool:
        """Replace the assignment read at ``version`` (None: none yet); False if another write came first."""
        ...

    def assignment_now(self) -> dict[int, tuple[str, int]]:
        """The assignment (partition -> (member, generation)) as the store holds it when this
        call is made: a linearizable read, unlike :meth:`read_assignment`'s (a ZooKeeper
        follower may lag), so that a member confirms it still owns a partition after a read
        request arrived (cluster/read_confirm.py). Bounded: CallUnanswered."""
        ...

    def read_view(self) -> dict:
        """Members (id -> advertised address), manager, assignment and relations, as ``layout.read_view``."""
        ...

    def fresh(self, heard_age: float) -> bool:
        """Whether a member whose last pass read the membership ``heard_age`` seconds ago may serve."""
        ...

    def engine_options(self, partition: int) -> dict[str, Any]:
        """``Engine.open``'s storage options for ``partition`` (metadata, log, blob store)."""
        ...

    def record_relation(self, name: str, partition: int) -> tuple[int, bool]:
        """Record ``name`` in ``partition`` unless recorded: (its partition, whether this call recorded it)."""
        ...

    def relation(self, name: str) -> tuple[int, Any] | None:
        """(partition, which record) of ``name``, or None."""
        ...

    def remove_relation(self, name: str, record: Any = None) -> None:
        """Remove ``name``'s record (with ``record``: only if it is still that record)."""
        ...

    def relation_names(self) -> list[str]:
        ...

