"""The race of appends against seals that the engine's and the server's tests both run:
writers append one row per time while a sealer seals every third time. An append refused
with TimeAlreadySealed must be absent afterwards, and every other one present."""

from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa

from sediment import errors


def _one(writer: int, t: int) -> pa.Table:
    return pa.table({"id": pa.array([writer], pa.int64()), "name": pa.array(["w"], pa.string()),
                     "time": pa.array([t], pa.int64()), "diff": pa.array([1], pa.int64())})


def race_appends_and_seals(target: Any, writers: int, last: int) -> tuple[set[tuple[int, int]], list]:
    """Race ``writers`` appenders (times 1 to ``last - 1``) against a sealer on relation ``r``
    (``id int64, name string``) of ``target`` (an Engine or a client), seal ``last``, and
    check what replays: the (writer, time) pairs written and those refused."""
    refused: list[tuple[int, int]] = []

    def writer(w: int) -> None:
        for t in range(1, last):
            try:
                target.append("r", _one(w, t))
            except errors.TimeAlreadySealed:
                refused.append((w, t))

    def sealer() -> None:
        for t in range(0, last, 3):
            target.seal("r", t)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)] + [threading.Thread(target=sealer)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    target.seal("r", last)
    written = {(i, t) for batch in target.replay("r")  # none at all when the sealer won every race
               for i, t in zip(batch.column("id").to_pylist(), batch.column("time").to_pylist(), strict=True)}
    assert written.isdisjoint(refused)
    assert len(written) + len(refused) == writers * (last - 1)
    return written, refused
