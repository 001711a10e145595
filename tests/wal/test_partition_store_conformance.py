"""One suite for the PartitionStore protocol (wal/replication/node/partition_store.py), run over
every store a storage node can serve from: segment files (FilePartitionStore), memory
(MemoryPartitionStore) and the simulation's disk with a write cache (tests/support/sim_world.py). The
request path of the storage node checks requests first; these are the stores' own answers, so
a node behaves the same over any of them."""

from __future__ import annotations

import random
import uuid

import pytest
import trio
import trio.testing
from support.memory_store import MemoryPartitionStore
from support.sim_world import SimDisk, SimPartitionStore

from sediment.errors import LowWaterMarkRegression, WalError
from sediment.wal import record as rec
from sediment.wal.control import PartitionState
from sediment.wal.replication.node.partition_store import (
    FilePartitionStore,
    PartitionStore,
    open_directory,
)

KEY = uuid.UUID("c0f0c0f0-0000-4000-8000-0000000000a1")


class FileHarness:
    def __init__(self, tmp_path) -> None:
        self.dir = str(tmp_path / "node")
        self.store: PartitionStore = self._open()

    def _open(self) -> FilePartitionStore:
        return open_directory(self.dir, KEY, segment_bytes=8192, checkpoint_records=10)(0)

    def reopen(self) -> None:
        """A clean restart: everything acknowledged is on disk."""
        self.store.close()
        self.store = self._open()

    def run(self, body) -> None:
        body()


class MemoryHarness:
    def __init__(self, tmp_path) -> None:
        self.store: PartitionStore = MemoryPartitionStore()

    def reopen(self) -> None:
        """Memory is durable at once and lives as long as the process: the same store."""

    def run(self, body) -> None:
        body()


class SimHarness:
    """The simulated disk runs under trio's MockClock; a reopen lets every sync complete,
    then crashes the disk (it keeps exactly what was synced) and opens a new store on it."""

    def __init__(self, tmp_path) -> None:
        self.disk = SimDisk("sim", random.Random(7))
        self.store: PartitionStore = SimPartitionStore(self.disk)
        self.clock = trio.testing.MockClock()

    def reopen(self) -> None:
        self.clock.jump(10.0)
        self.disk.crash()
        self.store = SimPartitionStore(self.disk)

    def run(self, body) -> None:
        async def main() -> None:
            body()

        trio.run(main, clock=self.clock)


HARNESSES = {"file": FileHarness, "memory": MemoryHarness, "sim": SimHarness}


@pytest.fixture(params=sorted(HARNESSES))
def h(request, tmp_path):
    harness = HARNESSES[request.param](tmp_path)
    yield harness
    harness.store.close()


def frame(lsn: int, n: int = 60) -> bytes:
    r = rec.Record(rec.RecordKind.UPDATES, relation_id=1, t_lo=lsn, t_hi=lsn, count=1,
                   body=(f"{lsn}:".encode() * n)[:n + lsn % 13])
    return rec.encode(r, lsn)


def write(store: PartitionStore, first: int, n: int) -> list[bytes]:
    frames = [frame(first + i) for i in range(n)]
    store.write(b"".join(frames), first, [len(f) for f in frames])
    return frames


def read_all(store: PartitionStore, start: int) -> bytes:
    out = b""
    lsn = start
    while True:
        got = store.read(lsn, 1 << 20)
        if not got:
            return out
        out += got
        lsn += sum(1 for _ in rec_iter(got))


def rec_iter(payload: bytes):
    pos = 0
    while pos < len(payload):
        head = rec.decode_header(payload, pos)
        assert head is not None, f"read returned a cut frame at offset {pos}"
        yield head.lsn
        pos += head.frame_size


def test_a_new_store_is_empty_with_the_initial_state(h):
    def body():
        s = h.store
        assert isinstance(s, PartitionStore)
        assert (s.start_lsn, s.next_lsn) == (0, 0)
        assert s.read(0, 1 << 20) == b""
        st = s.read_state()
        assert (st.session_id, st.low_water_mark, st.local_low_water_mark) == (0, -1, -1)
    h.run(body)


def test_write_then_read_whole_frames(h):
    def body():
        s = h.store
        frames = write(s, 0, 5) + write(s, 5, 1) + write(s, 6, 40)
        assert s.next_lsn == 46 and s.start_lsn == 0
        assert read_all(s, 0) == b"".join(frames)
        assert read_all(s, 17) == b"".join(frames[17:])
        assert s.read(3, 1) == frames[3]  # at least one frame, however small max_bytes is
        assert s.read(3, len(frames[3]) + len(frames[4])) == frames[3] + frames[4]
        assert s.read(46, 1 << 20) == b""
    h.run(body)


def test_a_write_at_the_wrong_lsn_is_refused_and_changes_nothing(h):
    def body():
        s = h.store
        frames = write(s, 0, 3)
        for wrong in (0, 2, 4, 100):
            f = frame(wrong)
            with pytest.raises(WalError):
                s.write(f, wrong, [len(f)])
        assert s.next_lsn == 3 and read_all(s, 0) == b"".join(frames)
    h.run(body)


def test_records_survive_a_restart(h):
    def body():
        frames = write(h.store, 0, 30)
        h.reopen()
        assert h.store.next_lsn == 30 and read_all(h.store, 0) == b"".join(frames)
        frames += write(h.store, 30, 2)
        assert read_all(h.store, 0) == b"".join(frames)
    h.run(body)


def test_truncate_keeps_exactly_the_records_below_and_refuses_outside_the_log(h):
    def body():
        s = h.store
        frames = write(s, 0, 30)
        s.truncate(30)  # keep everything: allowed
        assert s.next_lsn == 30
        for bad in (31, 100, -1):
            with pytest.raises(WalError):
                s.truncate(bad)
        s.truncate(12)
        assert s.next_lsn == 12 and read_all(s, 0) == b"".join(frames[:12])
        again = write(s, 12, 3)
        h.reopen()
        assert h.store.next_lsn == 15 and read_all(h.store, 0) == b"".join(frames[:12] + again)
        h.store.truncate(0)
        assert h.store.next_lsn == 0 and h.store.read(0, 1 << 20) == b""
    h.run(body)


def test_state_round_trips_counts_sequences_and_never_moves_marks_back(h):
    def body():
        s = h.store
        s.write_state(PartitionState(3, 10, 8))
        first = s.read_state()
        assert (first.session_id, first.low_water_mark, first.local_low_water_mark) == (3, 10, 8)
        s.write_state(PartitionState(4, 10, 9))
        second = s.read_state()
        assert second.sequence == first.sequence + 1 and second.session_id == 4
        for bad in (PartitionState(5, 9, 9), PartitionState(5, 10, 8)):
            with pytest.raises(LowWaterMarkRegression):
                s.write_state(bad)
        assert s.read_state() == second
        h.reopen()
        assert h.store.read_state() == second
    h.run(body)


def test_trim_prefix_never_drops_a_record_at_or_above_the_point(h):
    def body():
        s = h.store
        frames = write(s, 0, 200)
        s.trim_prefix(120)
        assert s.start_lsn <= 120 and s.next_lsn == 200
        assert read_all(s, 120) == b"".join(frames[120:])
        assert read_all(s, s.start_lsn) == b"".join(frames[s.start_lsn:])
        h.reopen()
        assert h.store.start_lsn <= 120 and h.store.next_lsn == 200
        assert read_all(h.store, 120) == b"".join(frames[120:])
        more = write(h.store, 200, 2)
        assert read_all(h.store, 120) == b"".join(frames[120:] + more)
    h.run(body)


def test_reset_drops_everything_and_continues_at_the_given_lsn(h):
    def body():
        s = h.store
        write(s, 0, 20)
        s.reset(500)
        assert (s.start_lsn, s.next_lsn) == (500, 500) and s.read(500, 1 << 20) == b""
        assert s.read(0, 1 << 20) == b"" and s.read(499, 1 << 20) == b""  # below the start: nothing
        with pytest.raises(WalError):
            f = frame(20)
            s.write(f, 20, [len(f)])
        frames = write(s, 500, 3)
        h.reopen()
        assert (h.store.start_lsn, h.store.next_lsn) == (500, 503)
        assert read_all(h.store, 500) == b"".join(frames)
        with pytest.raises(WalError):
            h.store.truncate(499)
        h.store.truncate(501)
        assert read_all(h.store, 500) == frames[0]
    h.run(body)
