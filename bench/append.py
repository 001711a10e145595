"""Durable append throughput of sediment, beside SQLite and the disk itself, in one run.

Why: the issue's targets are relative (3x SQLite, 50% of the raw sequential bandwidth),
and this machine is shared and noisy, so the peer and the limit are measured in the
same run, on the same file system, with the same rows:

* sediment ``Engine.append`` (durable on return) with one writer thread, batches of 1,
  100 and 10,000 rows of ~100 B and ~1 KiB (``id int64, payload binary`` plus the
  ``time`` and ``diff`` int64 columns; "row payload" = 8 + len(payload) + 8 + 8 bytes);
* SQLite (stdlib sqlite3), WAL mode, ``synchronous=FULL``, the same four columns, one
  transaction per batch with ``executemany``;
* the disk: 1 MiB sequential writes to a preallocated file, fdatasync after each (and,
  for reference, 4 KiB write + fdatasync: the floor of one group commit);
* 64 writer threads each appending single 100 B rows and waiting for durability
  (group commit): total rows/s, p50/p99 per-append latency, CPU per append and appends
  per fdatasync; beside 64 threads inserting one row per SQLite transaction (one shared
  connection, taken in turn).

Figures are medians over the interleaved rounds with min-max; ratios are taken between
peers of the same round.

    .venv/bin/python bench/append.py            # full run: 3 interleaved rounds x 1.5 s per case, about 90 s
    .venv/bin/python bench/append.py --quick    # 3 rounds x 0.6 s per case, about 40 s
    .venv/bin/python bench/append.py --json out.json

Temp directories go under ``--dir`` (default /tmp, the work tree's file system) and are
removed afterwards. MB = 10**6 bytes.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time

import pyarrow as pa

import sediment

MiB = 1024 * 1024
ROW_SIZES = {"100 B": 100, "1 KiB": 1024}
BATCHES = (1, 100, 10_000)
FIXED = 24  # id + time + diff, int64 each


# --- data ------------------------------------------------------------------------------------


def payload_len(row_bytes: int) -> int:
    return row_bytes - FIXED


def make_table(row_bytes: int, rows: int, first_id: int = 0) -> pa.Table:
    body = os.urandom(payload_len(row_bytes))
    return pa.table({
        "id": pa.array(range(first_id, first_id + rows), pa.int64()),
        "payload": pa.array([body] * rows, pa.binary()),
        "time": pa.array([1] * rows, pa.int64()),
        "diff": pa.array([1] * rows, pa.int64()),
    })


SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.binary())])


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


# --- sediment --------------------------------------------------------------------------------


def bench_sediment(root: str, row_bytes: int, batch: int, seconds: float, compact: bool = True) -> dict:
    d = tempfile.mkdtemp(prefix="sed-append-", dir=root)
    try:
        engine = sediment.open(d, compact=compact)
        try:
            engine.add_relation("r", SCHEMA)
            table = make_table(row_bytes, batch)
            engine.append("r", table)  # warm-up: first segment, first index write
            n = calls = 0
            t0, c0 = time.perf_counter(), time.process_time()
            while True:
                engine.append("r", table)
                n += batch
                calls += 1
                elapsed = time.perf_counter() - t0
                if elapsed >= seconds:
                    break
            cpu = time.process_time() - c0
        finally:
            engine.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return {"rows": n, "calls": calls, "seconds": elapsed, "rows_s": n / elapsed,
            "mb_s": n * row_bytes / elapsed / 1e6, "cpu_us_per_call": cpu / calls * 1e6}


def bench_sediment_concurrent(root: str, threads: int, row_bytes: int, seconds: float) -> dict:
    d = tempfile.mkdtemp(prefix="sed-append-conc-", dir=root)
    try:
        engine = sediment.open(d)
        try:
            engine.add_relation("r", SCHEMA)
            tables = [make_table(row_bytes, 1, first_id=k) for k in range(threads)]
            lats: list[list[float]] = [[] for _ in range(threads)]
            start = threading.Barrier(threads + 1)
            stop = threading.Event()

            def work(k: int) -> None:
                table, mine = tables[k], lats[k]
                engine.append("r", table)  # warm-up
                start.wait()
                while not stop.is_set():
                    a = time.perf_counter()
                    engine.append("r", table)
                    mine.append(time.perf_counter() - a)

            ts = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(threads)]
            for t in ts:
                t.start()
            start.wait()
            g0 = group_commits(engine)
            t0, c0 = time.perf_counter(), time.process_time()
            stop.wait(seconds)
            stop.set()
            for t in ts:
                t.join()
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
            g1 = group_commits(engine)
        finally:
            engine.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    all_lats = [x for xs in lats for x in xs]
    n = len(all_lats)
    return {"threads": threads, "rows": n, "seconds": elapsed, "rows_s": n / elapsed,
            "mb_s": n * row_bytes / elapsed / 1e6, "p50_ms": pct(all_lats, 0.50) * 1e3,
            "p99_ms": pct(all_lats, 0.99) * 1e3, "cpu_us_per_append": cpu / max(1, n) * 1e6,
            "group_commits": g1[0] - g0[0], "records_per_sync": (g1[1] - g0[1]) / max(1, g1[0] - g0[0])}


def group_commits(engine) -> tuple[float, float]:
    """(group commits, records in them) so far, from the engine's own histogram."""
    got = {s.name.rsplit("_", 1)[-1]: s.value for s in engine.metrics.group_commit.collect()[0].samples
           if s.name.endswith(("_count", "_sum"))}
    return got.get("count", 0.0), got.get("sum", 0.0)


# --- SQLite ----------------------------------------------------------------------------------


def sqlite_table(d: str, **connect) -> sqlite3.Connection:
    """The peer's database in directory ``d``: WAL mode, synchronous=FULL, table ``r`` of the four columns."""
    conn = sqlite3.connect(os.path.join(d, "bench.db"), isolation_level=None, **connect)
    assert conn.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE r (id INTEGER, payload BLOB, time INTEGER, diff INTEGER)")
    return conn


def bench_sqlite(root: str, row_bytes: int, batch: int, seconds: float) -> dict:
    d = tempfile.mkdtemp(prefix="sqlite-append-", dir=root)
    try:
        conn = sqlite_table(d)
        try:
            body = os.urandom(payload_len(row_bytes))
            rows = [(i, body, 1, 1) for i in range(batch)]
            sql = "INSERT INTO r VALUES (?, ?, ?, ?)"

            def one() -> None:
                conn.execute("BEGIN")
                conn.executemany(sql, rows)
                conn.execute("COMMIT")

            one()  # warm-up
            n = calls = 0
            t0 = time.perf_counter()
            while True:
                one()
                n += batch
                calls += 1
                elapsed = time.perf_counter() - t0
                if elapsed >= seconds:
                    break
        finally:
            conn.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return {"rows": n, "calls": calls, "seconds": elapsed, "rows_s": n / elapsed,
            "mb_s": n * row_bytes / elapsed / 1e6}


def bench_sqlite_concurrent(root: str, threads: int, row_bytes: int, seconds: float) -> dict:
    """The peer of sediment's 64 writers: as many threads inserting one row per transaction
    (WAL, synchronous=FULL) and waiting for it, through one shared connection taken in turn
    (SQLite has one writer at a time; separate connections spend their time in its busy
    handler's sleeps instead: 56 rows/s, p99 6 s in a trial here)."""
    d = tempfile.mkdtemp(prefix="sqlite-append-conc-", dir=root)
    try:
        conn = sqlite_table(d, check_same_thread=False)
        body = os.urandom(payload_len(row_bytes))
        lats: list[list[float]] = [[] for _ in range(threads)]
        start = threading.Barrier(threads + 1)
        stop = threading.Event()
        turn = threading.Lock()

        def work(k: int) -> None:
            mine = lats[k]
            start.wait()
            while not stop.is_set():
                a = time.perf_counter()
                with turn:
                    conn.execute("INSERT INTO r VALUES (?, ?, 1, 1)", (k, body))  # autocommit: one transaction
                mine.append(time.perf_counter() - a)

        ts = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(threads)]
        for t in ts:
            t.start()
        start.wait()
        t0 = time.perf_counter()
        stop.wait(seconds)
        stop.set()
        for t in ts:
            t.join()
        elapsed = time.perf_counter() - t0
        conn.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    all_lats = [x for xs in lats for x in xs]
    n = len(all_lats)
    return {"threads": threads, "rows": n, "seconds": elapsed, "rows_s": n / elapsed,
            "p50_ms": pct(all_lats, 0.50) * 1e3, "p99_ms": pct(all_lats, 0.99) * 1e3}


# --- the disk --------------------------------------------------------------------------------


def bench_disk(root: str, block: int, seconds: float, file_bytes: int, direct: bool = False) -> dict:
    """Sequential ``block``-sized pwrites to a preallocated file, fdatasync after each
    (through the page cache, or with O_DIRECT from an aligned buffer)."""
    d = tempfile.mkdtemp(prefix="disk-append-", dir=root)
    path = os.path.join(d, "seq")
    buf = mmap.mmap(-1, block)
    buf.write(os.urandom(block))
    fd = os.open(path, os.O_RDWR | os.O_CREAT | (os.O_DIRECT if direct else 0), 0o644)
    try:
        os.posix_fallocate(fd, 0, file_bytes)
        os.fsync(fd)
        off = n = 0
        lats = []
        t0 = time.perf_counter()
        while True:
            a = time.perf_counter()
            os.pwrite(fd, buf, off)
            os.fdatasync(fd)
            lats.append(time.perf_counter() - a)
            n += 1
            off += block
            if off + block > file_bytes:
                off = 0
            elapsed = time.perf_counter() - t0
            if elapsed >= seconds:
                break
    finally:
        os.close(fd)
        buf.close()
        shutil.rmtree(d, ignore_errors=True)
    return {"block": block, "writes": n, "seconds": elapsed, "writes_s": n / elapsed,
            "mb_s": n * block / elapsed / 1e6, "p50_ms": pct(lats, 0.5) * 1e3, "p99_ms": pct(lats, 0.99) * 1e3}


# --- report ----------------------------------------------------------------------------------


def fmt_rate(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}"


def machine() -> dict:
    u = platform.uname()
    return {"nproc": os.cpu_count(), "python": platform.python_version(), "kernel": f"{u.system} {u.release}",
            "sqlite": sqlite3.sqlite_version, "pyarrow": pa.__version__, "sediment": sediment.__version__}


def span(d: dict, key: str, fmt=fmt_rate) -> str:
    """``median (min-max)`` of a figure over the rounds."""
    return f"{fmt(d[key])} ({fmt(d[key + '_min'])}-{fmt(d[key + '_max'])})"


def _x(v: float) -> str:
    return f"{v:.2f}x"


def report(res: dict) -> str:
    out = []
    m = res["machine"]
    out.append(f"machine: nproc={m['nproc']} python={m['python']} kernel={m['kernel']} sqlite={m['sqlite']} "
               f"pyarrow={m['pyarrow']}; {res['seconds_per_case']} s per case x {res['rounds']} rounds; dir={res['dir']}")
    out.append("figures: median (min-max) over the interleaved rounds; ratios are taken within each round")
    out.append("")
    out.append("Single writer, durable on return (rows/s; MB/s of row payload)")
    out.append("| rows | batch | sediment rows/s | MB/s | SQLite rows/s | MB/s | sediment / SQLite |")
    out.append("| --- | --- | --- | --- | --- | --- | --- |")
    for label in ROW_SIZES:
        for batch in BATCHES:
            s = res["sediment"][f"{label}/{batch}"]
            q = res["sqlite"][f"{label}/{batch}"]
            r = res["ratio"][f"{label}/{batch}"]
            out.append(f"| {label} | {batch} | {span(s, 'rows_s')} | {s['mb_s']:.1f} | {span(q, 'rows_s')} | "
                       f"{q['mb_s']:.1f} | {span(r, 'ratio', _x)} |")
    if "sediment_nocompact" in res:
        s, r = res["sediment_nocompact"], res["ratio"]["nocompact"]
        out.append(f"| 1 KiB, compaction off | 10000 | {span(s, 'rows_s')} | {s['mb_s']:.1f} | (same round) | | "
                   f"{span(r, 'ratio', _x)} |")
    out.append("")
    disk, d4k = res["disk_1mib"], res["disk_4kib"]
    out.append(f"disk: 1 MiB write + fdatasync, preallocated: {disk['mb_s']:.0f} MB/s "
               f"({disk['mb_s_min']:.0f}-{disk['mb_s_max']:.0f}; {disk['writes_s']:.0f}/s, p50 {disk['p50_ms']:.2f} ms)")
    out.append(f"disk: 1 MiB O_DIRECT write + fdatasync, preallocated: {res['disk_direct']['mb_s']:.0f} MB/s "
               "(for reference: the device without the page cache; not the target's limit)")
    out.append(f"disk: 4 KiB write + fdatasync, preallocated: {d4k['writes_s']:.0f}/s "
               f"(p50 {d4k['p50_ms']:.3f} ms, p99 {d4k['p99_ms']:.3f} ms)")
    c, cq = res["concurrent"], res["sqlite_concurrent"]
    out.append(f"sediment, {c['threads']} writers x single 100 B rows: {span(c, 'rows_s')} rows/s, "
               f"p50 {c['p50_ms']:.2f} ms, p99 {c['p99_ms']:.2f} ms, {c['cpu_us_per_append']:.0f} us CPU per append, "
               f"{c['records_per_sync']:.1f} appends per fdatasync")
    out.append(f"SQLite, {cq['threads']} writers x single 100 B rows (one transaction each, shared connection): {span(cq, 'rows_s')} rows/s, "
               f"p50 {cq['p50_ms']:.2f} ms, p99 {cq['p99_ms']:.2f} ms")
    out.append("")
    out.append("Targets (median ratio)")
    out.append("| target | ours | peer/limit | ratio (min-max) | need | status |")
    out.append("| --- | --- | --- | --- | --- | --- |")
    for t in res["targets"]:
        out.append(f"| {t['name']} | {t['ours_s']} | {t['peer_s']} | {t['ratio']:.2f}x ({t['ratio_min']:.2f}-"
                   f"{t['ratio_max']:.2f}) | {t['need']:.2f}x | {'met' if t['met'] else 'MISSED'} |")
    return "\n".join(out)


def targets(res: dict) -> list[dict]:
    ts = []
    for label, need in (("100 B", 3.0), ("1 KiB", 4.0)):
        s = res["sediment"][f"{label}/10000"]["rows_s"]
        q = res["sqlite"][f"{label}/10000"]["rows_s"]
        r = res["ratio"][f"{label}/10000"]
        ts.append({"name": f"{label} rows, 10k batches: rows/s >= {need:.0f}x SQLite", "ours_s": fmt_rate(s),
                   "peer_s": fmt_rate(q), "ratio": r["ratio"], "ratio_min": r["ratio_min"],
                   "ratio_max": r["ratio_max"], "need": need})
    r = res["ratio"]["disk"]
    ts.append({"name": "1 KiB rows, 10k batches: MB/s >= 50% of disk seq",
               "ours_s": f"{res['sediment']['1 KiB/10000']['mb_s']:.0f} MB/s",
               "peer_s": f"{res['disk_1mib']['mb_s']:.0f} MB/s", "ratio": r["ratio"], "ratio_min": r["ratio_min"],
               "ratio_max": r["ratio_max"], "need": 0.5})
    c = res["concurrent"]
    ts.append({"name": "64 writers, single 100 B rows: >= 50k rows/s", "ours_s": fmt_rate(c["rows_s"]),
               "peer_s": "50.0k", "ratio": c["rows_s"] / 50_000, "ratio_min": c["rows_s_min"] / 50_000,
               "ratio_max": c["rows_s_max"] / 50_000, "need": 1.0})
    r = res["ratio"]["concurrent"]
    ts.append({"name": "64 writers, single rows, vs SQLite's 64 writers (no target)", "ours_s": fmt_rate(c["rows_s"]),
               "peer_s": fmt_rate(res["sqlite_concurrent"]["rows_s"]), "ratio": r["ratio"],
               "ratio_min": r["ratio_min"], "ratio_max": r["ratio_max"], "need": 0.0})
    for t in ts:
        t["met"] = t["ratio"] >= t["need"]
    return ts


def summarize(runs: list[dict], metric: str) -> dict:
    """The round whose ``metric`` is the median, with ``metric``'s median, min, max and every round's value."""
    values = [r[metric] for r in runs]
    mid = sorted(runs, key=lambda r: r[metric])[(len(runs) - 1) // 2]
    out = dict(mid)
    out.update({metric: statistics.median(values), f"{metric}_min": min(values), f"{metric}_max": max(values),
                "runs": values})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 rounds x 0.6 s per case (about 40 s)")
    ap.add_argument("--seconds", type=float, help="seconds per case and round (default 1.5, or 0.6 with --quick)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--threads", type=int, default=64, help="concurrent writers (default 64)")
    ap.add_argument("--dir", default=tempfile.gettempdir(),
                    help="where temp directories go; must be on the file system under test (default /tmp)")
    ap.add_argument("--compaction-off", action="store_true",
                    help="also run 1 KiB x 10k with the background compacter off (to see its share; the targets "
                         "use the default, compaction on)")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args(argv)
    secs = args.seconds or (0.6 if args.quick else 1.5)
    rounds = max(1, args.rounds)
    res: dict = {"machine": machine(), "seconds_per_case": secs, "rounds": rounds, "dir": args.dir, "sediment": {},
                 "sqlite": {}, "ratio": {}}

    def note(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    t_all = time.perf_counter()
    # Rounds interleave everything (disk, sediment, SQLite, 64 writers), so drift on this shared
    # machine hits peers and limits alike; figures are medians over the rounds, ratios are
    # taken between peers of the same round, and every round's figure is kept in the JSON.
    runs: dict[str, list[dict]] = {}

    def keep(key: str, r: dict) -> dict:
        runs.setdefault(key, []).append(r)
        return r

    for rnd in range(rounds):
        d = keep("disk_1mib", bench_disk(args.dir, MiB, min(1.0, secs), 1 << 30))
        note(f"[round {rnd + 1}/{rounds}] disk 1 MiB: {d['mb_s']:.0f} MB/s")
        for label, size in ROW_SIZES.items():
            for batch in BATCHES:
                s = keep(f"sediment/{label}/{batch}", bench_sediment(args.dir, size, batch, secs))
                q = keep(f"sqlite/{label}/{batch}", bench_sqlite(args.dir, size, batch, secs))
                keep(f"ratio/{label}/{batch}", {"ratio": s["rows_s"] / q["rows_s"]})
                if (label, batch) == ("1 KiB", 10_000):
                    keep("ratio/disk", {"ratio": s["mb_s"] / d["mb_s"]})
                note(f"[round {rnd + 1}/{rounds}] {label} x {batch}: sediment {fmt_rate(s['rows_s'])} rows/s, "
                     f"SQLite {fmt_rate(q['rows_s'])} rows/s, {s['rows_s'] / q['rows_s']:.2f}x")
        if args.compaction_off:
            s = keep("sediment_nocompact", bench_sediment(args.dir, 1024, 10_000, secs, compact=False))
            q = runs["sqlite/1 KiB/10000"][-1]
            keep("ratio/nocompact", {"ratio": s["rows_s"] / q["rows_s"]})
            note(f"[round {rnd + 1}/{rounds}] 1 KiB x 10000, compaction off: sediment {fmt_rate(s['rows_s'])} rows/s, "
                 f"{s['rows_s'] / q['rows_s']:.2f}x SQLite")
        c = keep("concurrent", bench_sediment_concurrent(args.dir, args.threads, 100, secs * 2))
        cq = keep("sqlite_concurrent", bench_sqlite_concurrent(args.dir, args.threads, 100, secs * 2))
        keep("ratio/concurrent", {"ratio": c["rows_s"] / cq["rows_s"]})
        note(f"[round {rnd + 1}/{rounds}] {args.threads} writers: sediment {fmt_rate(c['rows_s'])} rows/s "
             f"(p99 {c['p99_ms']:.1f} ms), SQLite {fmt_rate(cq['rows_s'])} rows/s (p99 {cq['p99_ms']:.1f} ms)")
        keep("disk_4kib", bench_disk(args.dir, 4096, min(0.5, secs), 64 * MiB))
        keep("disk_direct", bench_disk(args.dir, MiB, min(1.0, secs), 1 << 30, direct=True))

    for label in ROW_SIZES:
        for batch in BATCHES:
            res["sediment"][f"{label}/{batch}"] = summarize(runs[f"sediment/{label}/{batch}"], "rows_s")
            res["sqlite"][f"{label}/{batch}"] = summarize(runs[f"sqlite/{label}/{batch}"], "rows_s")
            res["ratio"][f"{label}/{batch}"] = summarize(runs[f"ratio/{label}/{batch}"], "ratio")
    res["ratio"]["disk"] = summarize(runs["ratio/disk"], "ratio")
    res["ratio"]["concurrent"] = summarize(runs["ratio/concurrent"], "ratio")
    if args.compaction_off:
        res["sediment_nocompact"] = summarize(runs["sediment_nocompact"], "rows_s")
        res["ratio"]["nocompact"] = summarize(runs["ratio/nocompact"], "ratio")
    res["concurrent"] = summarize(runs["concurrent"], "rows_s")
    res["sqlite_concurrent"] = summarize(runs["sqlite_concurrent"], "rows_s")
    res["disk_1mib"] = summarize(runs["disk_1mib"], "mb_s")
    res["disk_4kib"] = summarize(runs["disk_4kib"], "writes_s")
    res["disk_direct"] = summarize(runs["disk_direct"], "mb_s")
    res["targets"] = targets(res)
    res["total_seconds"] = time.perf_counter() - t_all
    print(report(res))
    print(f"\n(total {res['total_seconds']:.0f} s, {rounds} interleaved round(s))")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
