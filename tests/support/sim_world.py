"""The simulated world under a seeded simulation: network links and storage-node disks.

Everything here runs in the trio thread under a MockClock and draws its randomness from
``random.Random`` objects the caller seeds, so one seed gives one run.

* :class:`SimNet` connects a coordinator (by name) to a storage node (by address) with a
  pair of in-memory streams. Each message gets its own random delay, so messages on
  different connections overtake one another; on one connection they stay in order
  (TCP). A blocked link holds bytes until it heals (TCP retransmits; nothing is lost
  silently); a node crash or a reset breaks every connection of the node at once.
* :class:`SimDisk` is one replica's storage with a write cache: every write, truncation
  and state change is visible at once but durable only when its (random, in-order)
  sync completes. A crash keeps exactly the synced prefix of operations. The node's
  replies are held until everything it did before them is synced, which is what a
  real node's fdatasync-before-reply gives; so a crash loses only unacknowledged work.
  A full disk raises ``OSError(ENOSPC)`` from ``write``, as a real file system does.
"""

from __future__ import annotations

import errno
import math
import random
from collections import deque
from collections.abc import Callable

import trio

from sediment.errors import LowWaterMarkRegression, WalError
from sediment.wal.control import PartitionState
from sediment.wal.replication.node.partition_store import check_truncate


class SimNet:
    """Links between coordinators and storage nodes, with delays, blocks and resets."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.blocked: set[tuple[str, str]] = set()  # (src, dst); "*" matches anyone
        self.slow: dict[str, float] = {}  # node address -> extra delay bound (s)
        self._changed = trio.Event()
        self.nodes: dict[str, SimNodeEndpoint] = {}

    def is_blocked(self, src: str, dst: str) -> bool:
        b = self.blocked
        return bool(b) and ((src, dst) in b or (src, "*") in b or ("*", dst) in b)

    def block(self, src: str, dst: str) -> None:
        self.blocked.add((src, dst))
        self._touch()

    def unblock(self, src: str, dst: str) -> None:
        self.blocked.discard((src, dst))
        self._touch()

    def heal_all(self) -> None:
        self.blocked.clear()
        self.slow.clear()
        self._touch()

    def _touch(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_unblocked(self, src: str, dst: str) -> None:
        while self.is_blocked(src, dst):
            await self._changed.wait()

    def delay(self, node: str) -> float:
        d = self.rng.uniform(0.0002, 0.002)
        extra = self.slow.get(node, 0.0)
        if extra and self.rng.random() < 0.5:
            d += self.rng.uniform(0, extra)
        return d

    async def connect(self, client: str, address: str) -> trio.abc.Stream:
        """A coordinator's connect(): refused when the node is down, stalls while blocked."""
        await trio.sleep(self.delay(address))
        while True:
            ep = self.nodes.get(address)
            if ep is None or not ep.up:
                raise OSError(errno.ECONNREFUSED, f"simulated: storage node {address} refused the connection")
            if not (self.is_blocked(client, address) or self.is_blocked(address, client)):
                break
            await self._changed.wait()
        conn = SimConn(self, client, address, ep)
        ep.accept(conn)
        return conn.client


class SimNodeEndpoint:
    """What the network needs of a storage node: whether it is up, and where to serve."""

    def __init__(self, address: str, disk: SimDisk) -> None:
        self.address = address
        self.disk = disk
        self.up = False
        self.nursery: trio.Nursery | None = None
        self.serve: Callable | None = None
        self.conns: list[SimConn] = []
        self.scope: trio.CancelScope | None = None

    def accept(self, conn: SimConn) -> None:
        assert self.nursery is not None and self.serve is not None
        self.conns.append(conn)
        self.nursery.start_soon(self.serve, conn.server)

    def break_all(self) -> None:
        conns, self.conns = self.conns, []
        for c in conns:
            c.breaks()


class SimConn:
    """One connection: a client stream and a server stream over two one-way pipes."""

    def __init__(self, net: SimNet, client: str, address: str, ep: SimNodeEndpoint) -> None:
        self.broken = False
        c_send, s_recv = trio.open_memory_channel(math.inf)
        s_send, c_recv = trio.open_memory_channel(math.inf)
        self.client = SimStream(net, self, client, address, c_send, c_recv, hold=None)
        self.server = SimStream(net, self, address, client, s_send, s_recv, hold=ep.disk)

    def breaks(self) -> None:
        """Reset: both ends see the connection end; bytes in flight are gone."""
        if not self.broken:
            self.broken = True
            for s in (self.client, self.server):
                s.out.close()
                s.inp.close()


class SimStream(trio.abc.Stream):
    def __init__(self, net: SimNet, conn: SimConn, me: str, peer: str, out: trio.MemorySendChannel,
                 inp: trio.MemoryReceiveChannel, hold: SimDisk | None) -> None:
        self.net, self.conn, self.me, self.peer = net, conn, me, peer
        self.out, self.inp = out, inp
        self.hold = hold
        self.pending = b""
        self.closed = False
        self.last_when = 0.0
        self.node = peer if hold is None else me

    async def send_all(self, data) -> None:
        await trio.lowlevel.checkpoint()
        if self.closed:
            raise trio.ClosedResourceError("closed")
        if self.conn.broken:
            raise trio.BrokenResourceError("simulated: connection reset")
        when = max(self.last_when, trio.current_time() + self.net.delay(self.node))
        if self.hold is not None:  # a node's reply leaves only once its effects are synced
            when = max(when, self.hold.horizon)
        self.last_when = when
        try:
            self.out.send_nowait((when, bytes(data)))
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise trio.BrokenResourceError("simulated: peer gone") from exc

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes=None) -> bytes:
        if not self.pending:
            if self.conn.broken:
                return b""
            try:
                when, data = await self.inp.receive()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                return b""
            await trio.sleep_until(when)
            if self.net.is_blocked(self.peer, self.me):
                await self.net.wait_unblocked(self.peer, self.me)
                await trio.sleep(self.net.delay(self.node))
            if self.conn.broken:
                return b""
            self.pending = data
        n = len(self.pending) if max_bytes is None else max_bytes
        out, self.pending = self.pending[:n], self.pending[n:]
        return out

    async def aclose(self) -> None:
        self.closed = True
        self.out.close()
        self.inp.close()
        await trio.lowlevel.checkpoint()


_WRITE, _TRUNCATE, _STATE, _RESET = "write", "truncate", "state", "reset"


class SimDisk:
    """One replica's storage: a volatile view, a durable view, and the syncs in between."""

    def __init__(self, name: str, rng: random.Random,
                 on_state: Callable[[str, PartitionState, PartitionState], None] | None = None) -> None:
        self.name = name
        self.rng = rng
        self.frames: list[bytes] = []  # frames[i] is the record at LSN base + i
        self.base = 0
        self.state = PartitionState()
        self.durable_frames: list[bytes] = []
        self.durable_base = 0
        self.durable_state = PartitionState()
        self.pending: deque[tuple[float, str, object]] = deque()
        self.horizon = 0.0  # when everything done so far is durable
        self.capacity: int | None = None  # bytes; None: unlimited
        self.used = 0
        self.slow = 0.0
        self.on_state = on_state
        self.lost_ops = 0

    def _latency(self) -> float:
        lat = self.rng.uniform(0.0001, 0.002)
        if self.slow:
            lat += self.rng.uniform(0, self.slow)
        return lat

    def _op(self, kind: str, arg: object) -> None:
        now = trio.current_time()
        self._flush(now)
        self.horizon = max(self.horizon, now + self._latency())
        self.pending.append((self.horizon, kind, arg))

    def _flush(self, now: float) -> None:
        while self.pending and self.pending[0][0] <= now:
            _, kind, arg = self.pending.popleft()
            if kind == _WRITE:
                self.durable_frames.extend(arg)
            elif kind == _TRUNCATE:
                del self.durable_frames[arg - self.durable_base:]
            elif kind == _RESET:
                self.durable_frames, self.durable_base = [], arg
            else:
                self.durable_state = arg

    def crash(self) -> None:
        """Power loss: keep what was synced, drop the rest."""
        now = trio.current_time()
        self._flush(now)
        self.lost_ops += len(self.pending)
        self.pending.clear()
        self.frames = list(self.durable_frames)
        self.base = self.durable_base
        self.state = self.durable_state
        self.used = sum(len(f) for f in self.frames)
        self.horizon = now

    # --- what SimPartitionStore does ---------------------------------------------------------

    def write(self, frames: list[bytes]) -> None:
        size = sum(len(f) for f in frames)
        if self.capacity is not None and self.used + size > self.capacity:
            raise OSError(errno.ENOSPC, f"simulated: no space left on {self.name}'s disk")
        self.used += size
        self.frames.extend(frames)
        self._op(_WRITE, frames)

    def truncate(self, lsn: int) -> None:
        if lsn < self.base + len(self.frames):
            self.used -= sum(len(f) for f in self.frames[lsn - self.base:])
            del self.frames[lsn - self.base:]
            self._op(_TRUNCATE, lsn)

    def reset(self, lsn: int) -> None:
        self.used -= sum(len(f) for f in self.frames)
        self.frames, self.base = [], lsn
        self._op(_RESET, lsn)

    def set_state(self, state: PartitionState) -> None:
        old, self.state = self.state, state
        self._op(_STATE, state)
        if self.on_state is not None:
            self.on_state(self.name, old, state)


class SimPartitionStore:
    """A storage node's PartitionStore over a :class:`SimDisk` (runs in the trio thread)."""

    blocking = False

    def __init__(self, disk: SimDisk) -> None:
        self.disk = disk

    @property
    def next_lsn(self) -> int:
        return self.disk.base + len(self.disk.frames)

    @property
    def start_lsn(self) -> int:
        return self.disk.base

    def read_state(self) -> PartitionState:
        return self.disk.state

    def write_state(self, state: PartitionState) -> None:
        s = self.disk.state
        if state.low_water_mark < s.low_water_mark or state.local_low_water_mark < s.local_low_water_mark:
            raise LowWaterMarkRegression(f"simulated replica {self.disk.name}: low-water marks {state} below the "
                                         f"stored {s}")
        self.disk.set_state(PartitionState(state.session_id, state.low_water_mark, state.local_low_water_mark,
                                           s.sequence + 1))

    def write(self, payload: bytes, first_lsn: int, sizes: list[int]) -> None:
        if first_lsn != self.next_lsn:
            raise WalError(f"simulated replica {self.disk.name}: write at LSN {first_lsn}, next is "
                           f"{self.next_lsn}")
        frames, pos = [], 0
        for s in sizes:
            frames.append(bytes(payload[pos:pos + s]))
            pos += s
        self.disk.write(frames)

    def read(self, start: int, max_bytes: int) -> bytes:
        out = bytearray()
        frames = self.disk.frames
        for i in range(max(0, start - self.disk.base) if start >= self.disk.base else len(frames), len(frames)):
            f = frames[i]
            if out and len(out) + len(f) > max_bytes:
                break
            out += f
        return bytes(out)

    def truncate(self, lsn: int) -> None:
        check_truncate(lsn, self.start_lsn, self.next_lsn, f"simulated replica {self.disk.name}")
        self.disk.truncate(lsn)

    def trim_prefix(self, lsn: int) -> None:
        """The simulation keeps every record (trimming only saves space)."""

    def reset(self, lsn: int) -> None:
        self.disk.reset(lsn)

    def close(self) -> None:
        pass
