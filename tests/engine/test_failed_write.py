"""After a write whose outcome is unknown (here a real EIO from fdatasync on the file log: the
record's bytes were written, so the reopened engine shows it), the engine refuses reads and
writes with EngineFailed until it is reopened, rather than answering without the record.
The replicated log's QuorumLost is tests/wal/test_replicated_engine_failed.py."""

from __future__ import annotations

import errno
import os

import pyarrow as pa
import pytest

import sediment
from sediment.errors import EngineFailed, NothingWritten, TimeAlreadySealed, WalError

SCHEMA = pa.schema([("k", pa.int64())])


def ups(ks: list[int], t: int) -> pa.Table:
    return pa.table({"k": pa.array(ks, pa.int64()), "time": pa.array([t] * len(ks), pa.int64()),
                     "diff": pa.array([1] * len(ks), pa.int64())})


def keys(eng) -> list[int]:
    return sorted(k for b in eng.replay("r") for k in b.column("k").to_pylist())


def test_a_failed_sync_fails_the_engine_until_it_is_reopened(tmp_path, monkeypatch):
    eng = sediment.open(tmp_path / "d", compact_interval=3600)
    try:
        eng.add_relation("r", SCHEMA)
        eng.append("r", ups([1], 1))
        eng.seal("r", 1)
        with pytest.raises(TimeAlreadySealed):  # refused with nothing written: the engine goes on
            eng.append("r", ups([0], 1))
        assert keys(eng) == [1]

        def failing(fd: int) -> None:
            raise OSError(errno.EIO, "Input/output error (injected)")

        monkeypatch.setattr(os, "fdatasync", failing)
        with pytest.raises(WalError) as lost:
            eng.append("r", ups([2], 2))
        assert not isinstance(lost.value, NothingWritten)
        monkeypatch.undo()
        with pytest.raises(EngineFailed, match="open it again"):
            keys(eng)  # before: [1], while the reopened engine below shows [1, 2]
        with pytest.raises(EngineFailed):
            eng.snapshot("r", 1)
        with pytest.raises(EngineFailed):
            eng.append("r", ups([3], 3))
        with pytest.raises(EngineFailed):
            eng.stats()
    finally:
        monkeypatch.undo()
        eng.close()
    with sediment.open(tmp_path / "d") as eng:
        assert keys(eng) == [1, 2]
