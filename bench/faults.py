"""Fault campaigns against the public API: SIGKILL, file damage, power loss.

    python bench/faults.py --quick                 # ~50 kills, a few hundred damage trials, ~100 crash states
    python bench/faults.py                         # 1,000 kills per log, >= 10,000 damage trials, >= 1,500 states
    python bench/faults.py --only damage --seed 7 --wal file --trial 123   # one damage trial, in full

Everything is seeded. The figures that must be zero: acknowledged updates lost (kills, power),
opens refused after a kill or a power cut (a plain SIGKILL must never need a repair), partial
transactions, silent wrong answers, untyped exceptions, hangs, records that ``sediment verify
--repair`` destroyed, and verify/open disagreements. See docs/reliability.md.

The kills on the file log open with segment sizes of 4,224, 8,192 or 16,384 bytes drawn anew
for every child and every reopen, and half of the opens that check a kill's survivors use the
default options (64 MiB segments); the workload writes from concurrent threads (at times with a
compaction beside them) and drops and adds a relation again and again.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter

TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
if TESTS not in sys.path:  # the campaign's library is the test suite's support package
    sys.path.insert(0, TESTS)

from support import faults_damage as fd  # noqa: E402
from support import faults_kills as fk  # noqa: E402
from support import faults_power as fp  # noqa: E402

TRIAL_TIMEOUT = 60.0


# --- damage: worker processes with a per-trial timeout ------------------------------------------


class Worker:
    def __init__(self, workdir: str, wal: str, seed: int) -> None:
        self.args = (workdir, wal, seed)
        self.start()

    def start(self) -> None:
        workdir, wal, seed = self.args
        self.proc = subprocess.Popen([sys.executable, fd.__file__, "worker", workdir, wal, str(seed)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.buf = b""
        self.ready = self.line(600)
        self.busy: int | None = None

    def line(self, timeout: float) -> dict | None:
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while b"\n" not in self.buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(timeout=left):
                    if time.monotonic() >= deadline:
                        return None
                    continue
                chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
                if not chunk:
                    return None
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def send(self, index: int) -> None:
        self.busy = index
        self.deadline = time.monotonic() + TRIAL_TIMEOUT
        self.proc.stdin.write(f"{index}\n".encode())
        self.proc.stdin.flush()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()


def run_damage(work: str, wal: str, indices: list[int], seed: int, workers: int, log=print) -> list[dict]:
    pool = [Worker(os.path.join(work, f"damage-{wal}-{n}"), wal, seed) for n in range(workers)]
    results: list[dict] = []
    todo = list(reversed(indices))
    try:
        while todo or any(w.busy is not None for w in pool):
            for w in pool:
                if w.busy is None and todo:
                    w.send(todo.pop())
            for w in pool:
                if w.busy is None:
                    continue
                res = w.line(max(0.0, w.deadline - time.monotonic()) if len(pool) == 1 else 0.05)
                if res is not None:
                    w.busy = None
                    results.append(res)
                elif time.monotonic() >= w.deadline or w.proc.poll() is not None:
                    hung = w.busy
                    results.append({"spec": {"index": hung, "kind": "?", "damage": "?"}, "class": "hang",
                                    "verify": None, "agree": True, "destroyed": 0,
                                    "detail": "no answer within the trial timeout" if w.proc.poll() is None
                                    else f"worker died (exit {w.proc.returncode})"})
                    log(f"  damage/{wal} trial {hung}: hang or crash; restarting the worker")
                    w.kill()
                    w.start()
    finally:
        for w in pool:
            w.stop()
    return results


# --- the campaign ------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a small run (about 5 minutes on 2 cores)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", choices=("kills", "damage", "power"))
    ap.add_argument("--wal", choices=("file", "device"), help="only this log (kills, damage)")
    ap.add_argument("--kills", type=int, help="kill points per log")
    ap.add_argument("--damage", type=int, help="damage trials per log")
    ap.add_argument("--states", type=int, help="power-loss crash states in all")
    ap.add_argument("--trial", type=int, help="run just this damage trial and print it in full")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--workdir", help="scratch directory (default: a fresh temporary one, removed after)")
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args(argv)
    kills = args.kills or (25 if args.quick else 1000)
    damage = args.damage or (150 if args.quick else 5000)
    states = args.states or (100 if args.quick else 1600)
    wals = [args.wal] if args.wal else ["file", "device"]
    work = args.workdir or tempfile.mkdtemp(prefix="sediment-faults-")
    os.makedirs(work, exist_ok=True)
    me = f"python bench/faults.py --seed {args.seed}"
    t0 = time.monotonic()
    fig: dict[str, dict[str, int]] = {}
    failures: list[tuple[str, str, str]] = []  # (class of failure, reproduction command, note)
    try:
        if args.trial is not None:
            res = run_damage(work, wals[0], [args.trial], args.seed, 1)
            print(json.dumps(res[0], indent=2))
            return 0
        if args.only in (None, "kills"):
            for wal in wals:
                print(f"kills on the {wal} log: {kills} kill points ...", flush=True)
                ks = fk.run_kills(os.path.join(work, "kills"), wal, kills, args.seed, fk.KillStats())
                fig[f"kills/{wal}"] = {
                    "trials": ks.trials - ks.clean, "clean closes": ks.clean, "lost": ks.lost, "open refused": ks.refused, "partial": ks.partial,
                    "silent": ks.wrong, "untyped": ks.untyped, "hangs": ks.hangs, "disagree": ks.disagree}
                print(f"  kill points by phase: {dict(sorted(ks.phases.items()))}")
                failures += [(f"kills/{wal} " + n.split("] ")[-1].split(":")[0][:40], f"{me} --only kills --wal {wal} "
                              f"--kills {kills}", n) for n in ks.failures]
        if args.only in (None, "damage"):
            for wal in wals:
                print(f"damage on the {wal} log: {damage} trials ...", flush=True)
                results = run_damage(work, wal, list(range(damage)), args.seed, args.workers)
                classes = Counter(r["class"] for r in results)
                fig[f"damage/{wal}"] = {
                    "trials": len(results), "same": classes["same"], "typed": classes["typed"],
                    "reported": classes["reported"], "silent": classes["silent"], "untyped": classes["untyped"],
                    "hangs": classes["hang"], "destroyed": sum(r.get("destroyed", 0) for r in results),
                    "disagree": sum(not r["agree"] for r in results),
                    "verify crashed": sum(r.get("verify") == 99 for r in results)}
                bad = [r for r in results if r["class"] in ("silent", "untyped", "hang") or not r["agree"]
                       or r.get("destroyed") or r.get("verify") == 99]
                print_damage_classes(wal, results)
                for r in bad:
                    s = r["spec"]
                    what = r["class"] if r["class"] in ("silent", "untyped", "hang") else "ok-class " + r["class"]
                    failures.append((f"damage/{wal} {s['kind']} {s['damage']} {what} verify={r.get('verify')}",
                                     f"{me} --only damage --wal {wal} --trial {s['index']}",
                                     f"{s['kind']} {s['damage']}: {what}, verify exit {r.get('verify')}, "
                                     f"destroyed {r.get('destroyed', 0)}: {(r.get('detail') or '')[:160]}"))
        if args.only in (None, "power"):
            per = 200 if states >= 400 else states
            ps = fp.PowerStats()
            n = 0
            print(f"power loss: {states} crash states ...", flush=True)
            while ps.states < states:
                fp.run_power(os.path.join(work, "power"), args.seed + n, min(per, states - ps.states), ps,
                             log=lambda _line: None)
                n += 1
            fig["power"] = {"trials": ps.states, "lost": ps.lost, "open refused": ps.refused, "partial": ps.partial,
                            "silent": ps.wrong, "untyped": ps.untyped, "disagree": ps.disagree,
                            "bursts": ps.bursts, "joined records": ps.joined_records,
                            "states in joined": ps.states_in_joined, "pool offers": ps.pool_offers, "pool takes": ps.pool_takes,
                            "after reuse": ps.states_after_reuse}
            print(f"  {ps.traces} recorded workloads, {ps.bursts} concurrent bursts, {ps.joined_records} joined records "
                  f"written, {ps.states_in_joined} crash states with a joined record unsynced; failures by strategy: "
                  f"{ps.by_strategy}")
            failures += [("power " + note.split("] ")[-1].split(":")[0][:40], f"{me} --only power --states {states}", note)
                         for note in ps.failures]
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print_summary(fig, failures, time.monotonic() - t0)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seed": args.seed, "figures": fig, "failures": [[g, c, n] for g, c, n in failures]}, f, indent=1)
    return 1 if failures else 0


def print_damage_classes(wal: str, results: list[dict]) -> None:
    """Per file kind and damage kind: how many trials ended in each class."""
    table: dict[tuple[str, str], Counter] = {}
    for r in results:
        s = r["spec"]
        table.setdefault((s["kind"], s["damage"]), Counter())[r["class"]] += 1
    print(f"  {wal}: file kind / damage -> classes (verify disagreements)")
    for (kind, damage), c in sorted(table.items()):
        dis = sum(1 for r in results if (r["spec"]["kind"], r["spec"]["damage"]) == (kind, damage) and not r["agree"])
        print(f"    {kind:14s} {damage:9s} " + " ".join(f"{k}={v}" for k, v in sorted(c.items())) +
              (f"  disagree={dis}" if dis else ""))


ZERO = ("lost", "open refused", "partial", "silent", "untyped", "hangs", "destroyed", "disagree", "verify crashed")
ROWS = [("trials", "trials run"), ("clean closes", "step runs that closed cleanly (checked, not counted)"),
        ("lost", "acknowledged updates lost"), ("open refused", "opens refused after a kill / power cut"),
        ("partial", "partial transactions"), ("silent", "silent wrong answers"), ("untyped", "untyped exceptions"),
        ("hangs", "hangs"), ("destroyed", "records verify --repair destroyed"),
        ("disagree", "verify/open disagreements"), ("verify crashed", "verify crashed"),
        ("same", "same data (damage)"), ("typed", "typed errors (damage)"), ("reported", "reported losses (damage)"),
        ("bursts", "concurrent append bursts (power)"), ("joined records", "joined records written (power)"),
        ("states in joined", "crash states with a joined record unsynced (power)"),
        ("pool offers", "segment files offered to the pool (power)"), ("pool takes", "pool files reused (power)"),
        ("after reuse", "crash states after a reuse (power)")]


def print_summary(fig: dict[str, dict[str, int]], failures: list[tuple[str, str, str]], seconds: float) -> None:
    cols = list(fig)
    print()
    print("| figure | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for key, label in ROWS:
        if not any(key in fig[c] for c in cols):
            continue
        cells = []
        for c in cols:
            v = fig[c].get(key)
            cells.append("" if v is None else f"**{v}**" if key in ZERO and v else str(v))
        print(f"| {label} | " + " | ".join(cells) + " |")
    print(f"\n{seconds:.0f} s")
    if failures:
        groups = Counter(g for g, _c, _n in failures)
        print(f"\n{len(failures)} failures in {len(groups)} classes; one reproduction each:")
        shown: set[str] = set()
        for group, cmd, note in failures:
            if group not in shown:
                shown.add(group)
                print(f"  [{groups[group]}x] {group}\n      {cmd}\n      {note[:300]}")
    else:
        print("every figure that must be zero is zero")


if __name__ == "__main__":
    sys.exit(main())
