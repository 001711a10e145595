"""``sediment demo``: the end-to-end run on embedded defaults.

It generates a change stream (inserts, updates as retract-plus-insert, deletes)
over many timestamps, feeds it through the engine, seals each time, lets the
compacter compact, stops and reopens the engine (restart-time replay), then
reads the relation back at several times and compares each read with the same
consolidation computed independently with pyarrow from the generated input. The
exit code is non-zero on any mismatch.
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time

import pyarrow as pa
import pyarrow.compute as pc

import sediment
from sediment.progress import Progress

SCHEMA = pa.schema([("id", pa.int64()), ("item", pa.string()), ("qty", pa.int64())])
ITEMS = ["tea", "cake", "bread", "jam", "milk", "eggs", "rice", "salt"]


def generate(rows: int, times: int, seed: int = 7) -> list[pa.Table]:
    """One table of updates per timestamp 1..times: inserts, updates (retract the old row,
    insert the new one) and deletes (retract), about ``rows`` updates in all."""
    rnd = random.Random(seed)
    live: dict[int, tuple[str, int]] = {}
    next_id = 0
    per_time = max(1, rows // times)
    out = []
    for t in range(1, times + 1):
        ids, items, qtys, diffs = [], [], [], []

        def emit(i, row, d, ids=ids, items=items, qtys=qtys, diffs=diffs):
            ids.append(i)
            items.append(row[0])
            qtys.append(row[1])
            diffs.append(d)

        while len(ids) < per_time:
            action = rnd.random()
            if action < 0.5 or len(live) < 10:
                row = (rnd.choice(ITEMS), rnd.randint(1, 9))
                live[next_id] = row
                emit(next_id, row, 1)
                next_id += 1
            elif action < 0.85:
                i = rnd.choice(list(live)) if len(live) < 64 else rnd.randrange(next_id)
                if i not in live:
                    continue
                old = live[i]
                new = (old[0], old[1] + 1)
                emit(i, old, -1)
                emit(i, new, 1)
                live[i] = new
            else:
                i = rnd.randrange(next_id)
                if i in live:
                    emit(i, live.pop(i), -1)
        out.append(pa.table({"id": pa.array(ids, pa.int64()), "item": pa.array(items, pa.string()),
                             "qty": pa.array(qtys, pa.int64()), "time": pa.array([t] * len(ids), pa.int64()),
                             "diff": pa.array(diffs, pa.int64())}))
    return out


def expected_at(updates: pa.Table, as_of: int) -> pa.Table:
    """The consolidation computed straight from the input, independently of sediment."""
    upto = updates.filter(pc.less_equal(updates.column("time"), as_of))
    summed = upto.group_by(["id", "item", "qty"]).aggregate([("diff", "sum")]).rename_columns(
        ["id", "item", "qty", "diff"])
    summed = summed.filter(pc.not_equal(summed.column("diff"), 0))
    return summed.sort_by([("id", "ascending"), ("item", "ascending"), ("qty", "ascending")])


def run(args: argparse.Namespace) -> int:
    rows = int(getattr(args, "rows", None) or 100_000)
    times = int(getattr(args, "times", None) or 100)
    force = getattr(args, "progress", None)
    data_dir = tempfile.mkdtemp(prefix="sediment-demo-")  # never touches the user's data directory
    timings: dict[str, float] = {}
    try:
        t0 = time.perf_counter()
        stream = generate(rows, times)
        total = sum(t.num_rows for t in stream)
        timings["generate"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        with sediment.open(data_dir, segment_bytes=4 << 20, compact_interval=0.5) as engine:
            engine.add_relation("orders", SCHEMA)
            with Progress(total, "append", "rows", force=force) as bar:
                for t, table in enumerate(stream, start=1):
                    engine.append("orders", table)
                    engine.seal("orders", t)
                    bar.update(table.num_rows)
            timings["append+seal"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            engine.set_since("orders", times // 2)
            engine.compact()
            timings["compact"] = time.perf_counter() - t0
            info = engine.trace_info("orders")
        t0 = time.perf_counter()
        engine = sediment.open(data_dir, compact=False)
        timings["reopen"] = time.perf_counter() - t0
        everything = pa.concat_tables(stream)
        checks = sorted({times // 2, times * 2 // 3, times - 1, times})
        mismatches = []
        t0 = time.perf_counter()
        with engine, Progress(len(checks), "verify", "reads", force=force) as bar:
            for as_of in checks:
                got = engine.snapshot("orders", as_of)
                want = expected_at(everything, as_of)
                if not got.equals(want.cast(got.schema)):
                    mismatches.append(as_of)
                bar.update(1)
            replayed = sum(b.num_rows for b in engine.replay("orders"))
        timings["read"] = time.perf_counter() - t0
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    print(f"sediment demo: {total} updates over {times} times into relation 'orders'")
    print(f"  trace: {info['batches']} batches, {info['rows']} rows ({info['bytes'] / 1e6:.1f} MB), "
          f"since {info['since']}, upper {info['upper']}; {replayed} updates replayed after restart")
    print("  timings: " + ", ".join(f"{k} {v:.2f} s" for k, v in timings.items()))
    if mismatches:
        print(f"  verdict: MISMATCH at as_of {mismatches}")
        return 1
    print(f"  verdict: OK, reads at {checks} match the consolidation computed from the input")
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--times", type=int, default=100)
    raise SystemExit(run(parser.parse_args()))


if __name__ == "__main__":
    main()
