"""Taking the log on S3 over from a writer that appends back to back, three ways of
claiming side by side in the same rounds (docs/formats.md, "Log on S3", "Opening").

Why: an S3-only deployment is taken over by opening it anywhere, also while the coordinator
it replaces still appends (README, "An S3-only deployment"). Session 31's nemesis met opens
that failed: each claim at the slot after the newest lost to the writer's next PUT, and
after 32 rounds the open gave up. The ways:

* ``main``: the build before (``--build DIR``, ``git archive main | tar -x -C DIR``): claim
  the slot after the newest; after a lost round, list and read the newest again; 32 rounds.
* ``next-slot``: this build with every lost round claiming the next slot at once, without a
  LIST (``s3_claim.MAX_STEP = 1``, 32 rounds): no plug is ever needed, but each round is a
  race for one slot.
* ``doubling``: this build as it is: 1, 3, 7, 15, ... slots past the newest, then plugs.

S3 is moto behind the proxy that serializes conditional requests, in a process of its own
(tests/support/s3_process.py), ``--delay`` seconds added to every request (as S3's latency:
on bare moto a refused conditional PUT takes 3-5 times an accepted one, on S3 about the
same). The writer is tests/support/s3_writer.py (4 appending threads, one PUT always in
flight; its first thread trims after every 50 of its appends). Each way's opens run in a
child process of their own (so ``main`` imports the other checkout), each open timed from
the call to ``S3Log.open`` to its return, on a fresh log per way and round; an open waits
until the writer acknowledged 20 appends since the last takeover. Rounds interleave the
ways. Figures per way: opens won of tried, seconds per open (won), claim rounds, requests
per open (PUT, GET, LIST) and plugs, median with min-max over every open; the failed opens
by error.

    .venv/bin/python bench/s3_claim.py --build /tmp/before            # 3 rounds x 8 opens, delay 0
    .venv/bin/python bench/s3_claim.py --build /tmp/before --delay 0.02
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import uuid
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
sys.path.insert(0, HERE)

OPENER = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
if sys.argv[3]:
    from small_writes_cpu import use_build
    use_build(sys.argv[3])
from sediment.wal.s3_log import S3Log
if sys.argv[2] == "next-slot":
    from sediment.wal import s3_claim
    s3_claim.MAX_STEP, s3_claim.ROUNDS = 1, 32
for spec in sys.stdin:
    began = time.monotonic()
    try:
        log = S3Log.open(spec.strip())
    except Exception as exc:
        print(json.dumps({"ok": False, "seconds": time.monotonic() - began, "error": type(exc).__name__}), flush=True)
        continue
    seconds = time.monotonic() - began
    requests = log.requests
    print(json.dumps({"ok": True, "seconds": seconds, "requests": requests, "plugs": getattr(log, "plugs", 0),
                      "rounds": getattr(log, "claim_rounds", requests["put"])}), flush=True)
    log.close()
"""


def uptime() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def run_way(way: str, opener: subprocess.Popen, endpoint: str, bucket: str, opens: int) -> list[dict]:
    """``opens`` takeovers of a fresh log from a writer appending back to back."""
    from support.s3_writer import start_writer

    from sediment.wal.s3_log import S3Log

    spec = f"s3://{bucket}/{way}-{uuid.uuid4().hex[:8]}?endpoint={endpoint}"
    S3Log.open(spec, create=True).close()
    writer = start_writer(spec)
    got = []
    try:
        gen = 1
        for _ in range(opens):
            writer.wait_acks(gen, 20, timeout=120)
            opener.stdin.write(spec + "\n")
            opener.stdin.flush()
            result = json.loads(opener.stdout.readline())
            got.append(result)
            if result["ok"]:
                writer.wait_fenced(gen, timeout=120)
                writer.again()
                gen += 1
    finally:
        writer.stop()
    return got


def summary(values: list[float], fmt: str = "{:.0f}") -> str:
    if not values:
        return "-"
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", help="the build before (its opens are the 'main' way)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--opens", type=int, default=8, help="opens per way and round")
    ap.add_argument("--delay", type=float, default=0.0, help="seconds the proxy adds to every request")
    ap.add_argument("--json")
    args = ap.parse_args()
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    from support.s3_process import s3_process

    ways = (["main"] if args.build else []) + ["next-slot", "doubling"]
    results: dict[str, list[dict]] = {w: [] for w in ways}
    bucket = f"bench-claim-{uuid.uuid4().hex[:8]}"
    print(f"load {uptime()} at the start; delay {args.delay:g} s per request", flush=True)
    with s3_process(bucket, args.delay) as endpoint:
        openers = {w: subprocess.Popen([sys.executable, "-c", OPENER, HERE, w, args.build if w == "main" else ""],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for w in ways}
        try:
            for r in range(args.rounds):
                for w in ways:
                    got = run_way(w, openers[w], endpoint, bucket, args.opens)
                    results[w] += got
                    print(f"round {r + 1} {w}: {sum(g['ok'] for g in got)}/{len(got)} won, "
                          f"{summary([g['seconds'] for g in got if g['ok']], '{:.2f}')} s, load {uptime()}", flush=True)
        finally:
            for p in openers.values():
                p.stdin.close()
                p.kill()
    print(f"load {uptime()} at the end")
    print("| way | opens won | s per open won | claim rounds | PUT | GET | LIST | plugs | failures |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for w in ways:
        won = [g for g in results[w] if g["ok"]]
        failed = [g for g in results[w] if not g["ok"]]
        errors = Counter(g["error"] for g in failed)
        print(f"| {w} | {len(won)}/{len(results[w])} | {summary([g['seconds'] for g in won], '{:.2f}')} | "
              f"{summary([g['rounds'] for g in won])} | {summary([g['requests']['put'] for g in won])} | "
              f"{summary([g['requests']['get'] for g in won])} | {summary([g['requests']['list'] for g in won])} | "
              f"{summary([g['plugs'] for g in won])} | {len(failed)} {dict(errors)} "
              f"({summary([g['seconds'] for g in failed], '{:.2f}')} s) |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
