"""Segment recycling (wal/recycle.py): the disk effect behind it, and what it does for appends.

Why: an fdatasync after writing into fallocated, never-written blocks must also commit the
extents' conversion to the file system journal, and deleting a trimmed 64 MiB segment frees
its extents in a journal transaction the appender's next fdatasync waits behind. A log whose
compacter trims segments all the time (compaction on, the default) paid both; reusing the
trimmed files pays neither. Two parts, each with its peers in the same interleaved rounds:

* disk: ``--write-mib`` MiB writes, each followed by fdatasync, over a 64 MiB file that is
  (a) fallocated, never written (a new segment) or (b) written before (a reused segment);
* appends: one writer appending 10,000 rows of 1 KiB (``bench/compact_stream.py``'s rows)
  for ``--seconds``, durable on return, to an engine with compaction on (segments reused),
  compaction on with reuse switched off (``recycle.DEFAULT_KEEP = 0``: each trimmed segment
  deleted, each new one fallocated) and compaction off (nothing trimmed: new segments only).
  ``--rows same`` appends one table again and again, as bench/append.py does (it consolidates
  to 10,000 rows); ``--rows distinct`` gives every append fresh ids, so nothing consolidates
  and every byte is compacted (and the pending runs merged) while the stream goes on.

Figures are medians over the rounds with min-max; ratios are taken within a round.

    .venv/bin/python bench/recycle.py              # 3 rounds, 10 s per engine case
    .venv/bin/python bench/recycle.py --quick      # 3 rounds, 4 s per engine case
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from compact_stream import one_kib_rows  # noqa: E402

import sediment  # noqa: E402
from sediment.wal import recycle  # noqa: E402

FILE = 64 << 20


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def disk_case(root: str, written: bool, write: int, files: int = 4) -> float:
    """MB/s of ``write``-byte pwrite + fdatasync over ``files`` 64 MiB files."""
    buf = os.urandom(write)
    d = tempfile.mkdtemp(prefix="sed-recycle-disk-", dir=root)
    try:
        total = secs = 0.0
        for i in range(files):
            fd = os.open(os.path.join(d, f"{i}.seg"), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                if written:
                    for off in range(0, FILE, write):
                        os.pwrite(fd, buf[:min(write, FILE - off)], off)
                else:
                    os.posix_fallocate(fd, 0, FILE)
                os.fsync(fd)
                t0 = time.perf_counter()
                for off in range(0, FILE - write + 1, write):
                    os.pwrite(fd, buf, off)
                    os.fdatasync(fd)
                    total += write
                secs += time.perf_counter() - t0
            finally:
                os.close(fd)
        return total / secs / 1e6
    finally:
        shutil.rmtree(d, ignore_errors=True)


def engine_case(root: str, mode: str, seconds: float, rows: str = "same") -> dict:
    keep = recycle.DEFAULT_KEEP
    recycle.DEFAULT_KEEP = 0 if mode == "on, no reuse" else keep
    d = tempfile.mkdtemp(prefix="sed-recycle-", dir=root)
    try:
        eng = sediment.open(d, compact=mode != "off")
        eng.add_relation("r", pa.schema([("id", pa.int64()), ("payload", pa.binary())]))
        table = one_kib_rows(10_000, 0)
        n = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            if rows == "distinct":
                table = table.set_column(0, "id", pa.array(range(n, n + table.num_rows), pa.int64()))
            eng.append("r", table)
            n += table.num_rows
        elapsed = time.perf_counter() - t0
        reused = sum(1 for name in os.listdir(os.path.join(d, "wal", "0")) if name.endswith(".recycled"))
        eng.close()
        return {"rows_per_s": n / elapsed, "pool_files_at_end": reused}
    finally:
        recycle.DEFAULT_KEEP = keep
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--write-mib", type=int, default=10)
    ap.add_argument("--rows", choices=["same", "distinct"], default="same")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--json")
    args = ap.parse_args()
    seconds = args.seconds or (4.0 if args.quick else 10.0)
    rounds = max(3, args.rounds)
    load = os.getloadavg()[0]
    print(f"segment recycling: {rounds} rounds, {args.write_mib} MiB writes, {seconds:g} s per engine case, "
          f"{args.rows} rows, load {load:.1f}", flush=True)
    disk: dict[str, list[float]] = {"fallocated": [], "written before": []}
    eng: dict[str, list[float]] = {"on": [], "on, no reuse": [], "off": []}
    for r in range(rounds):
        for name in (list(disk) if r % 2 == 0 else list(reversed(disk))):
            disk[name].append(disk_case(args.dir, name == "written before", args.write_mib << 20))
        for mode in (list(eng) if r % 2 == 0 else list(reversed(eng))):
            eng[mode].append(engine_case(args.dir, mode, seconds, args.rows)["rows_per_s"] / 1e3)
        print(f"round {r + 1}: disk MB/s " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in disk.items())
              + "; appends k rows/s " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in eng.items()), flush=True)
    ratio_disk = [w / f for w, f in zip(disk["written before"], disk["fallocated"], strict=True)]
    ratio_on = [a / b for a, b in zip(eng["on"], eng["off"], strict=True)]
    ratio_noreuse = [a / b for a, b in zip(eng["on, no reuse"], eng["off"], strict=True)]
    print(f"\ndisk, {args.write_mib} MiB write + fdatasync: written-before {med(disk['written before'])} MB/s, "
          f"fallocated {med(disk['fallocated'])} MB/s; ratio {med(ratio_disk)}")
    print(f"appends 10k x 1 KiB ({args.rows} rows): compaction on {med(eng['on'])}k rows/s, on without reuse "
          f"{med(eng['on, no reuse'])}k, off {med(eng['off'])}k")
    print(f"on/off {med(ratio_on)} (target >= 0.9); on without reuse / off {med(ratio_noreuse)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"disk": disk, "appends": eng, "load": load}, f, indent=1)


if __name__ == "__main__":
    main()
