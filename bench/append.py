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
  (group commit): total rows/s and p50/p99 per-append latency.

    .venv/bin/python bench/append.py            # full run: 2 interleaved rounds x 1.5 s per case, about 50 s
    .venv/bin/python bench/append.py --quick    # 1 round x 0.6 s per case, about 10-15 s
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


def bench_sediment(root: str, row_bytes: int, batch: int, seconds: float) -> dict:
    d = tempfile.mkdtemp(prefix="sed-append-", dir=root)
    try:
        engine = sediment.open(d)
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
            t0, c0 = time.perf_counter(), time.process_time()
            time.sleep(seconds)
            stop.set()
            for t in ts:
                t.join()
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
            syncs = engine.wal.end_lsn  # one record per append: LSNs count appends, not syncs
        finally:
            engine.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    all_lats = [x for xs in lats for x in xs]
    n = len(all_lats)
    return {"threads": threads, "rows": n, "seconds": elapsed, "rows_s": n / elapsed,
            "mb_s": n * row_bytes / elapsed / 1e6, "p50_ms": pct(all_lats, 0.50) * 1e3,
            "p99_ms": pct(all_lats, 0.99) * 1e3, "records": syncs, "cpu_us_per_append": cpu / max(1, n) * 1e6}


# --- SQLite ----------------------------------------------------------------------------------


def bench_sqlite(root: str, row_bytes: int, batch: int, seconds: float) -> dict:
    d = tempfile.mkdtemp(prefix="sqlite-append-", dir=root)
    try:
        conn = sqlite3.connect(os.path.join(d, "bench.db"), isolation_level=None)
        try:
            assert conn.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("CREATE TABLE r (id INTEGER, payload BLOB, time INTEGER, diff INTEGER)")
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


def report(res: dict) -> str:
    out = []
    m = res["machine"]
    out.append(f"machine: nproc={m['nproc']} python={m['python']} kernel={m['kernel']} sqlite={m['sqlite']} "
               f"pyarrow={m['pyarrow']}; {res['seconds_per_case']} s per case x {res['rounds']} rounds; dir={res['dir']}")
    out.append("")
    out.append("Single writer, durable on return (rows/s; MB/s of row payload)")
    hdr = f"{'rows':>6} {'batch':>6} | {'sediment rows/s':>15} {'MB/s':>7} | {'SQLite rows/s':>13} {'MB/s':>7} | {'ratio':>6}"
    out.append(hdr)
    out.append("-" * len(hdr))
    for label in ROW_SIZES:
        for batch in BATCHES:
            s = res["sediment"][f"{label}/{batch}"]
            q = res["sqlite"][f"{label}/{batch}"]
            out.append(f"{label:>6} {batch:>6} | {fmt_rate(s['rows_s']):>15} {s['mb_s']:>7.1f} | "
                       f"{fmt_rate(q['rows_s']):>13} {q['mb_s']:>7.1f} | {s['rows_s'] / q['rows_s']:>5.2f}x")
    out.append("")
    disk, d4k = res["disk_1mib"], res["disk_4kib"]
    out.append(f"disk: 1 MiB write + fdatasync, preallocated: {disk['mb_s']:.0f} MB/s "
               f"({disk['writes_s']:.0f}/s, p50 {disk['p50_ms']:.2f} ms)")
    out.append(f"disk: 1 MiB O_DIRECT write + fdatasync, preallocated: {res['disk_direct']['mb_s']:.0f} MB/s "
               "(for reference: the device without the page cache; not the target's limit)")
    out.append(f"disk: 4 KiB write + fdatasync, preallocated: {d4k['writes_s']:.0f}/s "
               f"(p50 {d4k['p50_ms']:.3f} ms, p99 {d4k['p99_ms']:.3f} ms)")
    c = res["concurrent"]
    out.append(f"sediment, {c['threads']} writers x single 100 B rows: {fmt_rate(c['rows_s'])} rows/s, "
               f"p50 {c['p50_ms']:.2f} ms, p99 {c['p99_ms']:.2f} ms, {c['cpu_us_per_append']:.0f} us CPU per append "
               f"({c['rows']} appends in {c['seconds']:.1f} s)")
    out.append("")
    out.append("Targets")
    hdr = f"{'target':<52} | {'ours':>10} | {'peer/limit':>10} | {'ratio':>6} | {'need':>6} | status"
    out.append(hdr)
    out.append("-" * len(hdr))
    for t in res["targets"]:
        out.append(f"{t['name']:<52} | {t['ours_s']:>10} | {t['peer_s']:>10} | {t['ratio']:>5.2f}x | "
                   f"{t['need']:>5.2f}x | {'met' if t['met'] else 'MISSED'}")
    return "\n".join(out)


def targets(res: dict) -> list[dict]:
    ts = []
    for label in ROW_SIZES:
        s = res["sediment"][f"{label}/10000"]["rows_s"]
        q = res["sqlite"][f"{label}/10000"]["rows_s"]
        ts.append({"name": f"{label} rows, 10k batches: rows/s >= 3x SQLite", "ours": s, "peer": q,
                   "ours_s": fmt_rate(s), "peer_s": fmt_rate(q), "ratio": s / q, "need": 3.0})
    s = res["sediment"]["1 KiB/10000"]["mb_s"]
    d = res["disk_1mib"]["mb_s"]
    ts.append({"name": "1 KiB rows, 10k batches: MB/s >= 50% of disk seq", "ours": s, "peer": d,
               "ours_s": f"{s:.0f} MB/s", "peer_s": f"{d:.0f} MB/s", "ratio": s / d, "need": 0.5})
    c = res["concurrent"]["rows_s"]
    ts.append({"name": "64 writers, single 100 B rows: >= 50k rows/s", "ours": c, "peer": 50_000.0,
               "ours_s": fmt_rate(c), "peer_s": "50.0k", "ratio": c / 50_000, "need": 1.0})
    for t in ts:
        t["met"] = t["ratio"] >= t["need"]
    return ts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="about 15 s in all (0.6 s per case)")
    ap.add_argument("--seconds", type=float, help="seconds per case and round (default 1.5, or 0.6 with --quick)")
    ap.add_argument("--rounds", type=int, help="interleaved rounds, best kept (default 2, or 1 with --quick)")
    ap.add_argument("--threads", type=int, default=64, help="concurrent writers (default 64)")
    ap.add_argument("--dir", default=tempfile.gettempdir(),
                    help="where temp directories go; must be on the file system under test (default /tmp)")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args(argv)
    secs = args.seconds or (0.6 if args.quick else 1.5)
    rounds = args.rounds or (1 if args.quick else 2)
    res: dict = {"machine": machine(), "seconds_per_case": secs, "rounds": rounds, "dir": args.dir, "sediment": {}, "sqlite": {}}

    def note(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    t_all = time.perf_counter()
    # Rounds interleave everything (disk, sediment, SQLite, 64 writers), so drift on this shared
    # machine hits peers and limits alike; each figure is the best of its rounds (the least
    # disturbed one), and every round's figure is kept in the JSON.
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
                note(f"[round {rnd + 1}/{rounds}] {label} x {batch}: sediment {fmt_rate(s['rows_s'])} rows/s, "
                     f"SQLite {fmt_rate(q['rows_s'])} rows/s")
        c = keep("concurrent", bench_sediment_concurrent(args.dir, args.threads, 100, secs * 2))
        note(f"[round {rnd + 1}/{rounds}] {args.threads} writers: {fmt_rate(c['rows_s'])} rows/s")
        keep("disk_4kib", bench_disk(args.dir, 4096, min(0.5, secs), 64 * MiB))
        keep("disk_direct", bench_disk(args.dir, MiB, min(1.0, secs), 1 << 30, direct=True))
    d = keep("disk_1mib", bench_disk(args.dir, MiB, min(1.0, secs), 1 << 30))
    note(f"disk 1 MiB again: {d['mb_s']:.0f} MB/s")

    def best(key: str, metric: str = "rows_s") -> dict:
        r = dict(max(runs[key], key=lambda x: x[metric]))
        r["runs"] = [x[metric] for x in runs[key]]
        return r

    for label in ROW_SIZES:
        for batch in BATCHES:
            res["sediment"][f"{label}/{batch}"] = best(f"sediment/{label}/{batch}")
            res["sqlite"][f"{label}/{batch}"] = best(f"sqlite/{label}/{batch}")
    res["concurrent"] = best("concurrent")
    res["disk_1mib"] = best("disk_1mib", "mb_s")
    res["disk_4kib"] = best("disk_4kib", "writes_s")
    res["disk_direct"] = best("disk_direct", "mb_s")
    res["targets"] = targets(res)
    res["total_seconds"] = time.perf_counter() - t_all
    print(report(res))
    print(f"\n(total {res['total_seconds']:.0f} s, {rounds} round(s), best of rounds shown; disk 1 MiB runs: "
          f"{', '.join(f'{r:.0f}' for r in res['disk_1mib']['runs'])} MB/s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
