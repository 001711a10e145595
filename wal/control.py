"""The control file: the storage directory's identity and each partition's session state.

Waltz layout (docs/formats.md, "Control file"): a header, then one partition-info record
per partition holding two alternating copies of the partition's state. A state update
overwrites the older copy in place and fdatasyncs (wal/dual_slot.py); a copy torn by a
crash fails its CRC and the other copy is used, which rolls the partition back to its
previous session.
"""

from __future__ import annotations

import os
import struct
import time
import uuid
from dataclasses import dataclass

from sediment._fs import replace_durably
from sediment.errors import LowWaterMarkRegression, WalCorruption, WalError
from sediment.wal.dual_slot import newest, overwrite, seal, slot_offset, unseal
from sediment.wal.record import crc32c

CONTROL_NAME = "sediment-wal.ctl"
MAGIC = b"SDCT"
VERSION = 1
HEADER = struct.Struct("<4sIq16sI")  # magic, version, created_ns, cluster key, partitions
CRC_OFFSET = 124  # crc32c of header bytes [0, 124)
HEADER_SIZE = 128
STATE = struct.Struct("<qqqQI")  # session id, low-water mark, local low-water mark, sequence, crc
STATE_BODY = struct.Struct("<qqqQ")
PARTITION = struct.Struct("<I")
PARTITION_SIZE = PARTITION.size + 2 * STATE.size  # 4 + 2 * 36 = 76 bytes


@dataclass(frozen=True)
class PartitionState:
    """What a partition's last session recorded (Waltz's partition info struct).

    ``low_water_mark``: the partition's high-water mark in the cluster when the session
    started. ``local_low_water_mark``: the highest valid LSN this storage held then.
    Both are -1 for an empty log. ``sequence`` picks the newer of the two copies.
    """

    session_id: int = 0
    low_water_mark: int = -1
    local_low_water_mark: int = -1
    sequence: int = 0


@dataclass(frozen=True)
class ControlHeader:
    version: int
    created_ns: int
    cluster_key: uuid.UUID
    partitions: int


def _pack_state(state: PartitionState) -> bytes:
    return seal(STATE_BODY.pack(state.session_id, state.low_water_mark, state.local_low_water_mark,
                                state.sequence))


def _unpack_state(buf: bytes) -> PartitionState | None:
    body = unseal(buf, STATE_BODY.size)
    return None if body is None else PartitionState(*STATE_BODY.unpack(body))


class ControlFile:
    """The control file of one storage directory. Not thread-safe; its owner serialises."""

    def __init__(self, path: str, header: ControlHeader, partition_ids: list[int]):
        self.path = path
        self.header = header
        self._ids = partition_ids

    @classmethod
    def create(cls, directory: str, cluster_key: uuid.UUID | None = None) -> ControlFile:
        path = os.path.join(directory, CONTROL_NAME)
        header = ControlHeader(VERSION, time.time_ns(), cluster_key or uuid.uuid4(), 0)
        cls._write_whole(path, header, {})
        return cls(path, header, [])

    @classmethod
    def open(cls, directory: str) -> ControlFile:
        path = os.path.join(directory, CONTROL_NAME)
        with open(path, "rb") as f:
            data = f.read()
        header = _parse_header(data, path)
        whole = (len(data) - HEADER_SIZE) // PARTITION_SIZE
        if whole < header.partitions:
            off = HEADER_SIZE + whole * PARTITION_SIZE
            raise WalCorruption(f"control file {path} is truncated at partition {whole} (offset {off}); restore it "
                                "from a copy", path=path, offset=off, reason="truncated")
        return cls(path, header, [PARTITION.unpack_from(data, HEADER_SIZE + i * PARTITION_SIZE)[0]
                                  for i in range(header.partitions)])

    def check_cluster(self, cluster_key: uuid.UUID | None) -> None:
        """Refuse another cluster's storage directory (None: any)."""
        if cluster_key is not None and self.header.cluster_key != cluster_key:
            raise WalError(f"{self.path} belongs to cluster {self.header.cluster_key}, not {cluster_key}; "
                           "point this node at its own storage directory")

    @property
    def partitions(self) -> list[int]:
        return list(self._ids)

    def add_partition(self, partition_id: int) -> None:
        """Add a partition with an empty state: the file is rewritten whole (temp, fsync, rename)."""
        if partition_id in self._ids:
            return
        states = {pid: self.read_state(pid) for pid in self._ids}
        states[partition_id] = PartitionState()
        self.header = ControlHeader(self.header.version, self.header.created_ns, self.header.cluster_key,
                                    len(states))
        self._write_whole(self.path, self.header, states)
        self._ids = list(states)

    def read_state(self, partition_id: int) -> PartitionState:
        """The newer valid copy of the partition's state. Raises WalCorruption when both are bad."""
        off = self._offset(partition_id)
        with open(self.path, "rb") as f:
            f.seek(off + PARTITION.size)
            raw = f.read(2 * STATE.size)
        best, nvalid = newest((_unpack_state(raw[:STATE.size]), _unpack_state(raw[STATE.size:])),
                              lambda c: c.sequence)
        if best is None:
            if raw == bytes(len(raw)):
                return PartitionState()
            raise WalCorruption(
                f"both partition-info copies of partition {partition_id} in {self.path} fail their "
                f"checksums (offset {off}); the partition cannot be opened: restore the control file",
                path=self.path, offset=off, reason="both partition-info copies invalid",
            )
        return best

    def write_state(self, partition_id: int, state: PartitionState, *, rewind: bool = False) -> PartitionState:
        """Overwrite the older copy with ``state`` (its sequence is set here) and fdatasync.
        LowWaterMarkRegression if either low-water mark would move backwards, unless
        ``rewind``: only the local log passes it, whose marks say where it stands after a
        repair cut it (a storage node's marks are the cluster's commitments: never)."""
        current = self.read_state(partition_id)
        if not rewind and (state.low_water_mark < current.low_water_mark
                or state.local_low_water_mark < current.local_low_water_mark):
            raise LowWaterMarkRegression(
                f"partition {partition_id} in {self.path}: low-water marks ({state.low_water_mark}, local "
                f"{state.local_low_water_mark}) are below the stored ({current.low_water_mark}, local "
                f"{current.local_low_water_mark}); they only move forward: the writer has stale state")
        seq = current.sequence + 1
        new = PartitionState(state.session_id, state.low_water_mark, state.local_low_water_mark, seq)
        overwrite(self.path, _pack_state(new),
                  slot_offset(self._offset(partition_id) + PARTITION.size, STATE.size, seq))
        return new

    def _offset(self, partition_id: int) -> int:
        try:
            return HEADER_SIZE + self._ids.index(partition_id) * PARTITION_SIZE
        except ValueError:
            raise WalError(f"partition {partition_id} is not in control file {self.path}") from None

    @staticmethod
    def _write_whole(path: str, header: ControlHeader, states: dict[int, PartitionState]) -> None:
        head = HEADER.pack(MAGIC, header.version, header.created_ns, header.cluster_key.bytes,
                           len(states)).ljust(CRC_OFFSET, b"\0")
        out = bytearray(head + struct.pack("<I", crc32c(head)))
        for pid, state in states.items():
            out += PARTITION.pack(pid)
            first = _pack_state(state) if state.sequence % 2 == 0 else bytes(STATE.size)
            second = _pack_state(state) if state.sequence % 2 == 1 else bytes(STATE.size)
            out += first + second
        replace_durably(path, bytes(out))


def _parse_header(data: bytes, path: str) -> ControlHeader:
    if len(data) < HEADER_SIZE:
        raise WalCorruption(f"control file {path} is shorter than its 128-byte header", path=path, offset=0,
                            reason="truncated header")
    magic, version, created, key, parts = HEADER.unpack_from(data, 0)
    (crc,) = struct.unpack_from("<I", data, CRC_OFFSET)
    if magic != MAGIC:
        raise WalCorruption(f"{path} is not a sediment control file (magic {magic!r})", path=path, offset=0,
                            reason="bad magic")
    if version != VERSION:
        raise WalError(f"{path} has control-file format version {version}; this build reads {VERSION}")
    if crc32c(data[:CRC_OFFSET]) != crc:
        raise WalCorruption(f"control file {path} header fails its checksum (offset 0)", path=path, offset=0,
                            reason="header checksum")
    return ControlHeader(version, created, uuid.UUID(bytes=key), parts)


