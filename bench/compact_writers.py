"""A compaction pass over fresh keys from several writers, beside pyarrow doing the same by hand.

Why: issue 27 asks compaction's CPU per byte lowered until compaction on costs little beside
compaction off. Served and multi-writer appends run on the same two cores as the compacter,
so every microsecond a pass spends per row is taken from the writers. The common case is
fresh ids from several writers: each writer's ids increase, but their 1,000-row appends
interleave in the log, so the rows are neither sorted nor repeating.

Per round, in a fresh data directory with the background compacter off (only the timed,
explicit pass runs): ``--writers`` writers' 1,000-row appends of ~100 B rows (``id int64,
payload binary`` of random bytes, plus time and diff) interleaved append by append,
``--rows`` in all, then one ``engine.compact()`` timed in process CPU seconds. The peer,
timed the same way in the same round (order alternating): the same rows as one table
sorted by (id, time) with ``Table.sort_by`` and written with ``pq.write_table`` (zstd, the
batch format's compression) into a file of the same directory, fsynced. Figures are CPU
nanoseconds per row, medians with min-max over the rounds, and their ratio.

    .venv/bin/python bench/compact_writers.py                  # 3 rounds, 4 writers, 2M rows
    .venv/bin/python bench/compact_writers.py --rounds 5 --writers 16 --rows 4000000
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq

import sediment

SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.binary())])
ROWS_PER_APPEND = 1000
PAYLOAD = 76


def appends(writers: int, rows: int, seed: int) -> list[pa.Table]:
    """The appends in log order: writer ``w``'s ids start at ``w << 40`` and increase."""
    out = []
    made = [0] * writers
    for i in range(rows // ROWS_PER_APPEND):
        w = (i + seed) % writers
        base = (w << 40) + made[w]
        made[w] += ROWS_PER_APPEND
        blob = os.urandom(PAYLOAD * ROWS_PER_APPEND)
        out.append(pa.table({
            "id": pa.array(range(base, base + ROWS_PER_APPEND), pa.int64()),
            "payload": pa.array([blob[j * PAYLOAD:(j + 1) * PAYLOAD] for j in range(ROWS_PER_APPEND)], pa.binary()),
            "time": pa.array([1 + i // writers] * ROWS_PER_APPEND, pa.int64()),
            "diff": pa.array([1] * ROWS_PER_APPEND, pa.int64())}))
    return out


def cpu() -> float:
    t = os.times()
    return t.user + t.system


def sediment_pass(root: str, tables: list[pa.Table]) -> float:
    d = tempfile.mkdtemp(prefix="sed-cw-", dir=root)
    try:
        with sediment.open(d, compact=False, max_wal_backlog=None) as engine:
            engine.add_relation("r", SCHEMA)
            for t in tables:
                engine.append("r", t)
            c0 = cpu()
            engine.compact("r")
            return cpu() - c0
    finally:
        shutil.rmtree(d, ignore_errors=True)


def by_hand(root: str, tables: list[pa.Table]) -> float:
    d = tempfile.mkdtemp(prefix="pq-cw-", dir=root)
    try:
        table = pa.concat_tables(tables)
        c0 = cpu()
        out = table.sort_by([("id", "ascending"), ("time", "ascending")])
        path = os.path.join(d, "batch.parquet")
        pq.write_table(out, path, compression="zstd")
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return cpu() - c0
    finally:
        shutil.rmtree(d, ignore_errors=True)


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.0f} ({min(xs):.0f}-{max(xs):.0f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    a = parser.parse_args(argv)
    sed, peer, ratio = [], [], []
    for r in range(a.rounds):
        tables = appends(a.writers, a.rows, r)  # fresh ids and payloads every round
        n = sum(t.num_rows for t in tables)
        got = {}
        for name in (("sediment", "pyarrow") if r % 2 == 0 else ("pyarrow", "sediment")):
            got[name] = (sediment_pass if name == "sediment" else by_hand)(a.dir, tables) / n * 1e9
        sed.append(got["sediment"])
        peer.append(got["pyarrow"])
        ratio.append(got["sediment"] / got["pyarrow"])
        print(f"round {r + 1}: pass {got['sediment']:.0f} ns/row, sort_by + write_table {got['pyarrow']:.0f} ns/row, "
              f"load {os.getloadavg()[0]:.1f}")
    print(f"{a.writers} writers, {a.rows:,} rows of ~100 B, {a.rounds} rounds, CPU ns per row, median (min-max)")
    print(f"| compaction pass | sort_by + write_table | pass / by hand |\n| --- | --- | --- |\n"
          f"| {med(sed)} | {med(peer)} | {statistics.median(ratio):.2f}x ({min(ratio):.2f}-{max(ratio):.2f}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
