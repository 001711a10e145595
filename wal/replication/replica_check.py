"""Read-only inspection of a partition on its storage nodes, for ``sediment verify``.

A replicated engine's log lives on the nodes, not in its data directory, so verifying the
engine means asking each node: INFO, then READ of every record it still holds, each frame
checked (``wire.iter_records``) and the LSNs checked to follow each other. Neither request
changes anything on the node nor is ordered with its writes, so a running coordinator is
not disturbed. A node that cannot be reached is reported as such: the caller decides
whether enough of them were checked.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import trio

from sediment.errors import ReplicationError, WireError
from sediment.wal.replication.replica import ReplicaConnection, tcp_connect
from sediment.wal.replication.wire import MsgType, Status, iter_records

READ_BYTES = 1 << 20


@dataclass
class ReplicaReport:
    """What one node holds of a partition; ``error`` set when it could not be read."""

    address: str
    error: str = ""
    node_session: int = 0
    max_lsn: int = -1
    low_water_mark: int = -1
    first_lsn: int = -1  # the first record it still holds (below it: trimmed into batches)
    records: int = 0
    damage: str = ""  # a record that fails its checksum or breaks the LSN sequence

    @property
    def reachable(self) -> bool:
        return not self.error


async def _read_all(conn: ReplicaConnection, found: ReplicaReport) -> None:
    lsn = 0
    while lsn <= found.max_lsn:
        resp = await conn.call(MsgType.READ, found.node_session, lsn, READ_BYTES)
        if resp.status == Status.TRIMMED:
            lsn = max(lsn + 1, struct.unpack("<Q", resp.payload[:8])[0])
            continue
        if not resp.ok:
            found.damage = f"READ at LSN {lsn} refused: {resp.status.name}: {resp.message}"
            return
        if not resp.payload:
            found.damage = (f"holds records up to LSN {found.max_lsn} but returned none from LSN {lsn}: "
                            "records are missing")
            return
        try:
            for record in iter_records(resp.payload):
                if record.lsn != lsn and found.records:
                    found.damage = f"LSN {record.lsn} follows LSN {lsn - 1}: records are missing or out of order"
                    return
                if found.first_lsn < 0:
                    found.first_lsn = record.lsn
                found.records += 1
                lsn = record.lsn + 1
        except WireError as exc:
            found.damage = f"record after LSN {lsn - 1}: {exc}"
            return


Visit = Callable[[str, ReplicaConnection], Awaitable[None]]


async def visit_nodes(replicas: Sequence[str], cluster_key: uuid.UUID, partition: int, timeout: float,
                      visit: Visit) -> dict[str, str]:
    """Connect to every node at once and run ``visit(address, conn)`` on each; returns why
    each node that could not be reached or failed mid-way was skipped (address -> reason)."""
    failed: dict[str, str] = {}

    async def one(nursery: trio.Nursery, address: str) -> None:
        try:
            conn = await ReplicaConnection.open(nursery, address, tcp_connect, cluster_key, partition, timeout)
        except (ReplicationError, OSError) as exc:
            failed[address] = str(exc) or type(exc).__name__
            return
        try:
            await visit(address, conn)
        except (ReplicationError, OSError) as exc:
            failed[address] = str(exc) or type(exc).__name__
        finally:
            conn.kill("done")

    async with trio.open_nursery() as nursery:
        async with trio.open_nursery() as visits:
            for address in replicas:
                visits.start_soon(one, nursery, address)
        nursery.cancel_scope.cancel()
    return failed


async def _inspect(replicas: Sequence[str], cluster_key: uuid.UUID, partition: int,
                   timeout: float) -> list[ReplicaReport]:
    reports = {address: ReplicaReport(address) for address in replicas}

    async def check(address: str, conn: ReplicaConnection) -> None:
        found = reports[address]
        info = await conn.call(MsgType.INFO, 0)
        if info.status == Status.WRONG_CLUSTER:
            found.error = info.message
            return
        found.node_session, found.max_lsn = info.node_session, info.max_lsn
        found.low_water_mark = info.low_water_mark
        await _read_all(conn, found)

    for address, why in (await visit_nodes(replicas, cluster_key, partition, timeout, check)).items():
        reports[address].error = why
    return list(reports.values())


def inspect_replicas(replicas: Sequence[str], cluster_key: uuid.UUID | str, partition: int = 0,
                     timeout: float = 5.0) -> list[ReplicaReport]:
    """Each node's view of ``partition`` (see the module doc), in the order given."""
    key = cluster_key if isinstance(cluster_key, uuid.UUID) else uuid.UUID(str(cluster_key))
    return trio.run(_inspect, list(replicas), key, partition, timeout)
