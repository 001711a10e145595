"""A storage node's replica kept in memory: for deterministic simulations of the replication
protocol (everything is durable at once, and no thread is involved, so a MockClock run
stays deterministic)."""

from __future__ import annotations

from sediment.errors import LowWaterMarkRegression, WalError
from sediment.wal.control import PartitionState
from sediment.wal.replication.node.partition_store import check_truncate


class MemoryPartitionStore:
    """A replica kept in memory: for deterministic simulations (everything is durable at once).
    ``frames[i]`` is the record at LSN ``base + i``."""

    blocking = False

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.base = 0
        self.state = PartitionState()

    @property
    def next_lsn(self) -> int:
        return self.base + len(self.frames)

    @property
    def start_lsn(self) -> int:
        return self.base

    def read_state(self) -> PartitionState:
        return self.state

    def write_state(self, state: PartitionState) -> None:
        if (state.low_water_mark < self.state.low_water_mark
                or state.local_low_water_mark < self.state.local_low_water_mark):
            raise LowWaterMarkRegression(f"memory replica: low-water marks {state} below the stored {self.state}")
        self.state = PartitionState(state.session_id, state.low_water_mark, state.local_low_water_mark,
                                    self.state.sequence + 1)

    def write(self, payload: bytes, first_lsn: int, sizes: list[int]) -> None:
        if first_lsn != self.next_lsn:
            raise WalError(f"memory replica: write at LSN {first_lsn}, next is {self.next_lsn}")
        pos = 0
        for s in sizes:
            self.frames.append(payload[pos:pos + s])
            pos += s

    def read(self, start: int, max_bytes: int) -> bytes:
        out = bytearray()
        for f in self.frames[max(0, start - self.base):] if start >= self.base else []:
            if out and len(out) + len(f) > max_bytes:
                break
            out += f
        return bytes(out)

    def trim_prefix(self, lsn: int) -> None:
        """Simulations keep everything (trimming only saves space)."""

    def reset(self, lsn: int) -> None:
        self.frames = []
        self.base = lsn

    def truncate(self, lsn: int) -> None:
        check_truncate(lsn, self.start_lsn, self.next_lsn, "memory replica")
        del self.frames[lsn - self.base:]

    def close(self) -> None:
        pass
