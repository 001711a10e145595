"""The bounded WAL: a writer outrunning compaction keeps the backlog under ``max_wal_backlog``,
and opening afterwards costs about what reading that bounded backlog costs.

One writer appends 1 KiB rows (random keys, so every pass sorts, encodes and merges real work)
in 10,000-row appends, sealing each, as fast as it can for ``--seconds``, to an engine with the
background compacter on and ``max_wal_backlog=--bound``. After every append it reads the backlog
from ``Engine.stats()``; the figures are the largest backlog seen, how many appends waited, and the
write rate. The writer runs in a child process, SIGKILLed once the time is up and its backlog is
at least half the bound (a crash with a near-full backlog: what the bound limits). Then, in
interleaved rounds, the peers are measured cold (the
files' pages dropped with ``posix_fadvise(DONTNEED)`` before each): opening the engine (log
recovery and replay of the backlog; opened with ``compact=False`` so that the log stays the same
between rounds) against a sequential read, in 8 MiB reads, of a file of ``--bound`` random bytes
on the same file system: what reading a full bounded backlog costs on this disk. (The WAL files
themselves are no peer: the active segment is preallocated, and its unwritten extents read as
zeros without touching the disk.)

    .venv/bin/python bench/backlog.py              # 60 s writer, 256 MiB bound, 3 rounds
    .venv/bin/python bench/backlog.py --quick      # 15 s writer, 64 MiB bound, 3 rounds
    .venv/bin/python bench/backlog.py --json out.json --dir /tmp
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import pyarrow as pa
import pyarrow.compute as pc

import sediment

MiB = 1 << 20
SCHEMA = pa.schema([("k", pa.int64()), ("payload", pa.binary())])


def rows(n: int, t: int) -> pa.Table:
    keys = pc.floor(pc.multiply(pc.random(n), 1 << 40)).cast(pa.int64())
    payload = pa.array([os.urandom(16) * 62 for _ in range(64)] * (n // 64) + [b"x" * 992] * (n % 64), pa.binary())
    return pa.table({"k": keys, "payload": payload, "time": pa.array([t] * n, pa.int64()),
                     "diff": pa.array([1] * n, pa.int64())})


def child(d: str, bound: int, batch: int) -> None:
    """The writer (a child process): appends for ever, one JSON line per append."""
    eng = sediment.open(d, max_wal_backlog=bound, wal_backlog_timeout=600.0)
    eng.add_relation("r", SCHEMA)
    tables = [rows(batch, 0) for _ in range(4)]
    t = 0
    while True:
        t += 1
        eng.append("r", tables[t % 4].set_column(2, "time", pa.array([t] * batch, pa.int64())))
        eng.seal("r", t)
        print(json.dumps({"t": t, "backlog": eng.stats()["wal"]["backlog_bytes"], "waits": eng.view.backlog.waits,
                          "passes": eng.scheduler.passes}), flush=True)


def write(d: str, bound: int, seconds: float, batch: int) -> dict:
    """Run the writer for ``seconds``, then SIGKILL it at the first append after which the
    backlog is at least half the bound (within another ``seconds / 2``): the restart then has
    a near-full bounded backlog to replay, the case the bound exists for."""
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", d, str(bound), str(batch)],
                            stdout=subprocess.PIPE, text=True)
    seen, last = [], {}
    t0 = time.perf_counter()
    try:
        for line in proc.stdout:
            last = json.loads(line)
            seen.append(last["backlog"])
            elapsed = time.perf_counter() - t0
            if elapsed >= seconds and (last["backlog"] >= bound // 2 or elapsed >= 1.5 * seconds):
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
    n = last["t"] * batch
    return {"rows": n, "seconds": elapsed, "rows_per_s": n / elapsed, "mb_per_s": n * 1024 / elapsed / 1e6,
            "max_backlog_bytes": max(seen), "backlog_at_end": seen[-1], "appends": len(seen),
            "appends_that_waited": last["waits"], "compaction_passes": last["passes"], "bound": bound}


def wal_files(d: str) -> list[str]:
    out = []
    for root, _dirs, files in os.walk(os.path.join(d, "wal")):
        out += [os.path.join(root, f) for f in sorted(files)]
    return out


def drop_cache(paths: list[str]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_all(paths: list[str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    total = 0
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while chunk := f.read(8 * MiB):
                total += len(chunk)
    return time.perf_counter() - t0, total


def open_once(d: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    eng = sediment.open(d, compact=False)
    elapsed = time.perf_counter() - t0
    backlog = eng.stats()["wal"]["backlog_bytes"]
    eng.close()
    return elapsed, backlog


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--bound", type=int, help="max_wal_backlog in bytes (default 256 MiB, quick 64 MiB)")
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--json")
    args = ap.parse_args()
    seconds = args.seconds or (15.0 if args.quick else 60.0)
    bound = args.bound or ((64 if args.quick else 256) * MiB)
    d = tempfile.mkdtemp(prefix="sed-backlog-", dir=args.dir)
    try:
        print(f"== writer: {seconds:g} s of {args.batch:,} x 1 KiB rows per append (sealed each), "
              f"max_wal_backlog {bound / MiB:.0f} MiB ==", flush=True)
        w = write(d, bound, seconds, args.batch)
        print(f"{w['rows_per_s'] / 1e3:.0f}k rows/s ({w['mb_per_s']:.0f} MB/s), {w['appends']} appends, "
              f"{w['appends_that_waited']} waited; {w['compaction_passes']} passes; backlog max "
              f"{w['max_backlog_bytes'] / MiB:.1f} MiB (bound {bound / MiB:.0f} MiB), at the end "
              f"{w['backlog_at_end'] / MiB:.1f} MiB (killed there): {'under the bound' if w['max_backlog_bytes'] <= bound else 'OVER'}",
              flush=True)
        paths = wal_files(d)
        wal_bytes = sum(os.path.getsize(p) for p in paths)
        peer = os.path.join(args.dir, f"sed-backlog-peer-{os.getpid()}")
        with open(peer, "wb") as f:
            for _ in range(0, bound, 8 * MiB):
                f.write(os.urandom(min(8 * MiB, bound)))
            f.flush()
            os.fsync(f.fileno())
        print(f"\n== open ({len(paths)} WAL files, {wal_bytes / MiB:.0f} MiB apparent) vs a sequential read of "
              f"{bound / MiB:.0f} MiB, cold, {args.rounds} rounds interleaved ==", flush=True)
        opens, reads, backlog = [], [], 0
        for r in range(args.rounds):
            for what in (("open", "read") if r % 2 == 0 else ("read", "open")):
                drop_cache(paths + [peer])
                if what == "open":
                    elapsed, backlog = open_once(d)
                    opens.append(elapsed)
                else:
                    reads.append(read_all([peer])[0])
            print(f"round {r + 1}: open {opens[-1]:.3f} s, read {reads[-1]:.3f} s", flush=True)
        ratio = [o / x for o, x in zip(opens, reads, strict=True)]
        os.unlink(peer)
        print(f"open {med(opens)} s; sequential read of the bound {med(reads)} s; open/read {med(ratio)}; backlog replayed "
              f"{backlog / MiB:.1f} MiB; WAL on disk {wal_bytes / MiB:.0f} MiB (bound {bound / MiB:.0f} MiB)")
        out = {"writer": w, "wal_bytes": wal_bytes, "opens": opens, "reads": reads, "ratios": ratio,
               "backlog_replayed": backlog}
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
