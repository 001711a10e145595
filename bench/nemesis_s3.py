"""A nemesis campaign against an S3-only deployment (session 31): takeovers of real
``sediment serve`` coordinators and S3 faults from a seeded schedule, checked as
bench/nemesis.py checks the cluster.

Processes: moto's S3 on 127.0.0.1 and, in front of it, a fault proxy
(tests/support/faulty_proxy.py, conditional PUTs serialized per object as S3 does) through
which every coordinator reaches S3; one S3-only deployment (log, metadata and batches in
the bucket) of 6 relations; three coordinator slots, each a data directory and a port of
its own (tests/support/s3_only_procs.py), of which one serves at a time: a coordinator
started on a slot opens the deployment from its metadata spec alone, which takes it over
and fences the one before (it must exit 3, having acknowledged nothing after the claim).
Client processes (bench/nemesis_client.py) send keyed appends, seals and snapshot reads to
whichever coordinator serves, trying the known addresses in turn
(bench/nemesis_failover.py). Every 1-4 s the nemesis starts one of:

- ``kill``: SIGKILL the serving coordinator; 0.5-3 s later another slot takes over;
- ``takeover``: another slot takes over while the serving one runs;
- ``pause``: SIGSTOP the serving one, 0.5-2 s later another takes over, 1-3 s after that
  SIGCONT the old one (awake, it must acknowledge nothing, and exit 3);
- ``s3_stall``, ``s3_reset``, ``s3_5xx``: for 1-8 s (``--s3-fault``) every S3 request is held
  unanswered, has its connection reset (before it is forwarded or after, its answer lost),
  or is answered 500 or 503.

One coordinator fault at a time (each waits for the replaced coordinator's exit); S3
faults overlap them. A takeover that fails to open (S3 away) is tried again on another slot.
After ``--seconds`` every fault is healed, one coordinator serves, the clients stop, every
relation is sealed past every append and read, then one more takeover and the same reads
through the new coordinator (``divergent`` compares them); the checker
(tests/support/nemesis_checker.py) counts what must be zero.

    python bench/nemesis_s3.py [--seconds 60 | --quick] [--seed 1] [--clients 3] [--appenders 2]
                               [--interval 1-4] [--s3-fault 1-8] [--weights kill=3,...] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import nemesis_client  # noqa: E402
import nemesis_failover  # noqa: E402
from nemesis import (  # noqa: E402
    RELATIONS,
    STORE_UNAVAILABLE,
    Clients,
    campaign_args,
    expected_errors,
    report,
    run_campaign,
    s3_window,
    span,
)
from support.faulty_proxy import FaultyProxy  # noqa: E402
from support.nemesis_checker import check  # noqa: E402
from support.s3_only_procs import Coordinator, s3_env  # noqa: E402

import sediment  # noqa: E402

TOKEN = "nemesis-s3-token"
BUCKET = "bench"
KINDS = {"kill": 3, "takeover": 3, "pause": 3, "s3_stall": 2, "s3_reset": 2, "s3_5xx": 2}
FENCE_EXIT = 30.0  # seconds a replaced coordinator has to exit (it looks at the log every 2 s)
START_DEADLINE = 180.0  # seconds the nemesis keeps trying to get a coordinator serving
SERVE_TIMEOUT = 120.0  # seconds the healed deployment has to answer a call


class Slot:
    """A coordinator's data directory and port (kept across its starts), and its process."""

    def __init__(self, root: Path, name: str, metadata: str, env: dict[str, str]) -> None:
        self.dir, self.metadata, self.env = root / name, metadata, env
        self.port = 0
        self.proc: Coordinator | None = None

    def start(self) -> None:
        self.proc = (Coordinator(self.dir, self.metadata, self.env) if not self.port
                     else Coordinator.again(self.dir, self.metadata, self.env, self.port))
        self.port = self.proc.port

    @property
    def uri(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    def running(self) -> bool:
        return self.proc is not None and self.proc.running()


class S3Nemesis:
    """Faults from a seeded schedule (see the module doc), each on a thread of its own."""

    def __init__(self, slots: list[Slot], proxy: FaultyProxy, seed: int, interval: tuple[float, float],
                 weights: dict[str, float], s3_fault: tuple[float, float]) -> None:
        self.slots, self.proxy, self.interval, self.weights, self.s3_fault = slots, proxy, interval, weights, s3_fault
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.applied: Counter = Counter()
        self.skipped: Counter = Counter()
        self.problems: list[str] = []
        self.exits: Counter = Counter()  # exit codes of replaced coordinators (3: fenced)
        self.failed_starts: Counter = Counter()  # takeovers that did not open, by reason, tried again
        self.takeovers = 0
        self.current = slots[0]
        self.coordinator_busy = self.s3_busy = False

    def run(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        kinds, weights = list(self.weights), list(self.weights.values())
        while not self.stop.wait(self.rng.uniform(*self.interval)) and time.monotonic() < end:
            kind = self.rng.choices(kinds, weights)[0]
            action = self._claim(kind, self.rng.random(), self.rng.random(), self.rng.random())
            if action is None:
                self.skipped[kind] += 1
                continue
            self.applied[kind] += 1
            t = threading.Thread(target=self._guard, args=(kind, action), name=f"nemesis-{kind}", daemon=True)
            self.threads.append(t)
            t.start()

    def _claim(self, kind: str, pick: float, a: float, b: float):  # noqa: ANN202 - a closure or None
        with self.lock:
            if kind.startswith("s3_"):
                if self.s3_busy:
                    return None
                self.s3_busy = True
                low, high = self.s3_fault
                return lambda: self._s3(kind, low + (high - low) * a, pick)
            if self.coordinator_busy:
                return None
            self.coordinator_busy = True
        if kind == "kill":
            return lambda: self._coordinator(lambda old: old.proc.kill(), 0.5 + 2.5 * a, 0.0, pick)
        if kind == "takeover":
            return lambda: self._coordinator(None, 0.0, 0.0, pick)
        return lambda: self._coordinator(lambda old: old.proc.signal(signal.SIGSTOP), 0.5 + 1.5 * a, 1.0 + 2.0 * b,
                                         pick)

    def _guard(self, kind: str, action) -> None:  # noqa: ANN001
        try:
            action()
        except Exception as exc:  # noqa: BLE001 - reported with the figures
            self.problems.append(f"{kind}: {type(exc).__name__}: {exc}")

    def _s3(self, kind: str, seconds: float, pick: float) -> None:
        try:
            s3_window(self.proxy, kind, seconds, pick)
        finally:
            self.s3_busy = False

    def _coordinator(self, hit, before: float, wake: float, pick: float) -> None:  # noqa: ANN001
        """``hit(old)`` (None: nothing), ``before`` s later another slot takes over, ``wake`` s
        after that a paused old one is SIGCONTed; then the old one must exit, fenced."""
        try:
            old = self.current
            if hit is not None:
                hit(old)
            time.sleep(before)
            self.current = self.take_over(pick, exclude=old)
            if old.running():
                time.sleep(wake)
                old.proc.signal(signal.SIGCONT)
                self.await_exit(old)
        finally:
            self.coordinator_busy = False

    def await_exit(self, old: Slot) -> None:
        try:
            code = old.proc.wait(FENCE_EXIT)
        except Exception:  # noqa: BLE001 - a replaced coordinator still running: a finding
            self.problems.append(f"the replaced coordinator on {old.dir.name} still ran {FENCE_EXIT:g} s after the "
                                 "takeover: killed")
            old.proc.kill()
            return
        self.exits[code] += 1
        if code != 3:
            self.problems.append(f"the replaced coordinator on {old.dir.name} exited {code}, not 3 (superseded)")

    def take_over(self, pick: float, exclude: Slot | None) -> Slot:
        """Start a coordinator on a slot other than ``exclude`` that runs nothing; a start that
        fails (its open met an S3 fault) is tried again, on the next slot, until the deadline."""
        deadline = time.monotonic() + START_DEADLINE
        free = [s for s in self.slots if s is not exclude and not s.running()]
        i = int(pick * len(free))
        while True:
            slot = free[i % len(free)]
            try:
                slot.start()
                self.takeovers += 1
                return slot
            except Exception as exc:  # noqa: BLE001 - counted; a problem only past the deadline
                self.failed_starts[type(exc).__name__] += 1
                if time.monotonic() > deadline:
                    raise
            i += 1
            time.sleep(1.0)

    def heal(self) -> None:
        """Stop scheduling, let every fault end (each is bounded), SIGCONT anything paused,
        and have one coordinator serving, every other one exited."""
        self.stop.set()
        for t in self.threads:
            t.join(START_DEADLINE + FENCE_EXIT + 60)
        self.proxy.clear()
        for s in self.slots:
            if s.running():
                s.proc.signal(signal.SIGCONT)
        if not self.current.running():
            self.current = self.take_over(0.0, exclude=None)
        for s in self.slots:
            if s is not self.current and s.running():
                self.problems.append(f"the coordinator on {s.dir.name} still ran after the heal, beside the serving "
                                     "one: killed")
                s.proc.kill()


def serving(uri: str, timeout: float = SERVE_TIMEOUT) -> float:
    """Seconds until the coordinator at ``uri`` answers ``relations()``."""
    began = time.monotonic()
    while True:
        try:
            with sediment.connect(uri, token=TOKEN, timeout=10) as db:
                db.relations()
            return time.monotonic() - began
        except Exception:  # noqa: BLE001 - its engine reopening after an S3 fault: ask again
            if time.monotonic() - began > timeout:
                raise
            time.sleep(0.2)


def read_all(uri: str, top: int) -> dict:
    """Every relation sealed at ``top`` (if not yet) and read there: relation -> key -> diff."""
    out = {}
    with sediment.connect(uri, token=TOKEN) as db:
        for name in RELATIONS:
            if db.sealed(name) < top:
                db.seal(name, top)
            snap = db.snapshot(name, top)
            out[name] = dict(zip(snap.column("k").to_pylist(), snap.column("diff").to_pylist(), strict=True))
    return out


def campaign(args: argparse.Namespace, tmp: Path, endpoint: str) -> int:
    """One run: the deployment, the coordinators, the clients, the nemesis, the heal and the check."""
    with FaultyProxy(endpoint, serialize_conditional=True) as proxy:
        metadata = f"s3://{BUCKET}/meta?endpoint={proxy.endpoint}"
        with sediment.open(tmp / "setup", wal=f"s3://{BUCKET}/wal", metadata=metadata, blob=f"s3://{BUCKET}/blobs",
                           s3_endpoint=proxy.endpoint) as eng:
            for name in RELATIONS:
                eng.add_relation(name, nemesis_client.SCHEMA)
        env = s3_env(TOKEN)
        slots = [Slot(tmp, f"coordinator{i}", metadata, env) for i in range(args.coordinators)]
        nem = S3Nemesis(slots, proxy, args.seed, span(args.interval),
                        {**KINDS, **{k: float(v) for k, v in (w.split("=") for w in args.weights.split(",") if w)}},
                        span(args.s3_fault))
        try:
            for s in reversed(slots):  # each start takes over from the one before: every slot gets its port
                previous = nem.current if nem.current.running() else None
                s.start()
                nem.current = s
                if previous is not None:
                    nem.await_exit(previous)
            clients = Clients(args, tmp, ",".join(s.uri for s in slots), TOKEN, nemesis_failover.connect)
            began = time.monotonic()
            nem.run(args.seconds)
            nem.heal()
            print(f"nemesis ran {time.monotonic() - began:.0f} s; healed", flush=True)
            try:
                settled = serving(nem.current.uri)
            except Exception as exc:  # noqa: BLE001 - reported
                nem.problems.append(f"no coordinator served within {SERVE_TIMEOUT:g} s of the heal: {exc}")
                settled = float("nan")
            history, hung, absorbed = clients.stop(nem.problems)
            top = max([a.time for a in history.appends], default=0) + 1
            final = read_all(nem.current.uri, top)
            old = nem.current
            nem.current = nem.take_over(0.0, exclude=old)  # one more takeover: the same state must be there
            nem.await_exit(old)
            members = {nem.current.uri: read_all(nem.current.uri, top)}
            f = check(history, final, members, expected_errors() | STORE_UNAVAILABLE)
            report(f, nem, args.seed, args.seconds, settled, hung, absorbed, nem.weights)
            faults = Counter(kind for _m, _p, kind in proxy.log.faults)
            print(f"takeovers {nem.takeovers} (replaced coordinators' exit codes {dict(nem.exits)}; failed opens tried "
                  f"again {dict(nem.failed_starts)}); S3 requests {len(proxy.log.requests)}, sabotaged {dict(faults)}")
            return f.violations() + len(nem.problems) + clients.missing()
        finally:
            for s in slots:
                if s.proc is not None and s.running():
                    s.proc.kill()


def main() -> None:
    ap = campaign_args(f"default {','.join(f'{k}={v}' for k, v in KINDS.items())}", "45 s of faults (65-80 s in all)")
    ap.add_argument("--coordinators", type=int, default=3, help="coordinator slots (data directories)")
    args = ap.parse_args()
    if args.quick:
        args.seconds = 45.0
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # the clients' gRPC notes on a coordinator going away
    run_campaign(args, BUCKET, campaign)


if __name__ == "__main__":
    main()
