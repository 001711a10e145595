"""Before a coordinator claims a partition its metadata store has never recorded: are the
storage nodes already holding that partition for someone else?

Storage nodes know a partition by its number and the cluster key only. Two engines
whose metadata lives under different ZooKeeper roots (or in different stores) but
which point at the same nodes with the same key would both be "partition 0": the
second one's recovery would see replicas that are new to its metadata and truncate
them to their low-water mark, destroying the first engine's records, or be fenced
by the first one's higher session and report a baffling lost quorum. So a coordinator
whose metadata has no record of the partition asks each node (INFO, which changes
nothing) first; a node that has seen a session or holds records belongs to another
metadata store, and opening is refused with PartitionClaimed.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import trio

from sediment.errors import PartitionClaimed
from sediment.wal.replication.replica import ReplicaConnection
from sediment.wal.replication.replica_check import visit_nodes
from sediment.wal.replication.wire import MsgType


async def _probe(replicas: Sequence[str], cluster_key: uuid.UUID, partition: int,
                 timeout: float) -> list[tuple[str, int, int]]:
    found: list[tuple[str, int, int]] = []

    async def info(address: str, conn: ReplicaConnection) -> None:
        resp = await conn.call(MsgType.INFO, 0)
        found.append((address, resp.node_session, resp.max_lsn))

    await visit_nodes(replicas, cluster_key, partition, timeout, info)  # unreachable nodes: skipped
    return found


def refuse_claimed_partition(replicas: Sequence[str], cluster_key: uuid.UUID, partition: int,
                             where: str, timeout: float = 5.0) -> None:
    """Raise PartitionClaimed if a reachable node holds ``partition`` that the metadata at
    ``where`` has no record of. Unreachable nodes are skipped (recovery handles them)."""
    found = trio.run(_probe, list(replicas), cluster_key, partition, timeout)
    used = [(a, s, m) for a, s, m in found if s > 0 or m >= 0]
    if used:
        held = ", ".join(f"{a} (session {s}, max LSN {m})" for a, s, m in used)
        raise PartitionClaimed(
            f"partition {partition}: the metadata at {where} has no record of it, but storage nodes already hold "
            f"it: {held}. They serve another engine (another ZooKeeper root or metadata store with the same "
            f"cluster key {cluster_key}); give this engine its own storage nodes or its own cluster key "
            "(`sediment storage-node --cluster-key`), or point it at the metadata store that owns them")
