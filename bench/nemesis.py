"""A nemesis campaign against a cluster of coordinators (session 30): real processes, random
faults from a seeded schedule, several at once, and a checker of what the clients saw.

Processes: a ZooKeeper, moto's S3, three storage nodes (quorum 2 of 3) and three ``sediment
serve --cluster`` members (tests/support/cluster_procs.py), 4 partitions, 6 relations. Client
processes (bench/nemesis_client.py) send keyed appends (``append_once`` with their own client
ids and sequence numbers, resent with the same key while the outcome is unknown), seals and
snapshot reads over every relation. Meanwhile the nemesis, every 1-4 s, starts one of:

- ``kill``: SIGKILL a member, restart it (on its data directory) 0.5-3 s later;
- ``term``: SIGTERM a member (it hands its partitions over and exits), restart it;
- ``pause``: SIGSTOP a member for 1-4 s longer than the ZooKeeper session, then SIGCONT (its
  partitions are taken over meanwhile: awake again, it must acknowledge nothing);
- ``zk_pause``: SIGSTOP ZooKeeper for 1-4 s (``--zk-pause``), then SIGCONT;
- ``node_kill``: SIGKILL one storage node (never two at once), restart it 1-4 s later.

With ``--membership s3`` (session 31) the cluster is an S3-only one: no ZooKeeper, no storage
nodes; three ``serve --cluster s3://...`` members (tests/support/cluster_procs.py's S3Cluster,
membership by leases on the S3 metadata store, ``--lease-time`` as the session timeout), every
S3 request of members and clients through tests/support/faulty_proxy.py in front of moto.
Instead of ``zk_pause`` and ``node_kill`` the nemesis opens S3 fault windows (``--s3-fault``,
1-8 s): ``s3_stall`` (every request held unanswered), ``s3_reset`` (connections reset, before
the request is forwarded or after) and ``s3_5xx`` (answered 500 or 503); a pause outlasts the
lease, as it outlasts the ZooKeeper session.

Faults overlap (at most two members faulted at once, so one serves). After ``--seconds`` the
clients stop sending, every fault is healed, the cluster settles (bounded) and each relation
is sealed past every append and read through the cluster and through each member; the
checker (tests/support/nemesis_checker.py, pure) counts what must be zero.

    python bench/nemesis.py [--seconds 60 | --quick] [--seed 1] [--clients 3] [--appenders 2]
                            [--session-timeout 3] [--interval 1-4] [--zk-pause 1-4]
                            [--weights kill=3,term=2,pause=3,zk_pause=1,node_kill=2] [--workdir DIR]
    python bench/nemesis.py --membership s3 [--lease-time 4] [--s3-fault 1-8] [--seconds 60 | --quick] ...
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import nemesis_client  # noqa: E402
from support.cluster_procs import TOKEN, Cluster, MemberProc, S3Cluster  # noqa: E402
from support.faulty_proxy import FaultyProxy  # noqa: E402
from support.fixtures_zookeeper import ZooKeeperServer  # noqa: E402
from support.nemesis_checker import Figures, check  # noqa: E402

import sediment  # noqa: E402

PARTITIONS = 4
RELATIONS = [f"r{i}" for i in range(6)]  # r_i in partition i % 4
SETTLE_TIMEOUT = 120.0  # seconds the healed cluster has to serve every partition again
EXIT_TIMEOUT = 90.0  # a SIGTERMed member's hand-over, grace and closes
START_DEADLINE = 180.0  # seconds a member of an S3-only cluster is restarted for while S3 fails its start
KINDS = {"kill": 3, "term": 2, "pause": 3, "zk_pause": 1, "node_kill": 2}
S3_KINDS = {"kill": 3, "term": 2, "pause": 3, "s3_stall": 1, "s3_reset": 1, "s3_5xx": 1}
# what an S3 fault longer than botocore's retries surfaces as where the outcome is known (nothing
# was written: a read, or a keyed append whose table of applied keys could not be read)
STORE_UNAVAILABLE = {"MetadataUnavailable", "BlobError"}
# refusals the workload provokes: an append (or a resend of one) below a seal another client
# made meanwhile, a seal behind another's
REFUSALS = {"TimeAlreadySealed", "InvalidTime", "FrontierRegression"}


def s3_window(proxy: FaultyProxy, kind: str, seconds: float, pick: float) -> None:
    """An S3 fault window of ``kind`` (s3_stall, s3_reset, s3_5xx: 500 or 503 by ``pick``),
    waited out."""
    how = {"s3_stall": "stall", "s3_reset": "reset", "s3_5xx": "fail"}[kind]
    proxy.window(how, seconds, status=500 if pick < 0.5 else 503)
    time.sleep(seconds)


def expected_errors() -> set[str]:
    """The typed errors a call may end with: the refusals above, and what the client says
    after its deadline (outcome unknown: any OutcomeUnknown; unavailable)."""
    from sediment import errors

    unknown = {name for name, cls in vars(errors).items()
               if isinstance(cls, type) and issubclass(cls, errors.OutcomeUnknown)}
    return REFUSALS | unknown | {"CoordinatorUnavailable"}


class Slot:
    """One of the three members: its data directory (kept across restarts) and its process."""

    def __init__(self, cluster: Cluster, name: str) -> None:
        self.cluster, self.dir = cluster, cluster.root / name
        self.proc: MemberProc | None = None
        self.busy = False  # a fault holds it

    def start(self) -> None:
        self.proc = MemberProc(self.cluster.uri, self.dir, self.cluster.env)
        self.cluster.members.append(self.proc)

    def running(self) -> bool:
        return self.proc is not None and self.proc.proc.poll() is None


class Nemesis:
    """Faults from a seeded schedule, each in a thread of its own, until stopped; then heals."""

    def __init__(self, cluster: Cluster | S3Cluster, slots: list[Slot], zk: ZooKeeperServer | None, seed: int,
                 session: float, interval: tuple[float, float] = (1.0, 4.0), weights: dict[str, float] | None = None,
                 zk_pause: tuple[float, float] = (1.0, 4.0), proxy: FaultyProxy | None = None) -> None:
        self.cluster, self.slots, self.zk, self.session, self.interval = cluster, slots, zk, session, interval
        self.zk_pause = zk_pause  # with ``proxy`` (an S3-only cluster): how long an S3 fault window lasts
        self.proxy = proxy
        self.weights = dict(weights or KINDS)
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.applied: Counter = Counter()
        self.skipped: Counter = Counter()
        self.problems: list[str] = []  # a member that did not exit on SIGTERM, a restart that failed
        self.zk_busy = False
        self.node_busy = False
        self.failed_starts: Counter = Counter()  # S3-only: restarts whose start met an S3 fault, tried again
        self.timeline: list[str] = []  # "HH:MM:SS kind" of each fault started (UTC, as the members' logs)

    def run(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        kinds, weights = list(self.weights), list(self.weights.values())
        while not self.stop.wait(self.rng.uniform(*self.interval)) and time.monotonic() < end:
            kind = self.rng.choices(kinds, weights)[0]
            action = self._claim(kind, self.rng.random(), self.rng.random())
            if action is None:
                self.skipped[kind] += 1
                continue
            self.applied[kind] += 1
            self.timeline.append(f"{time.strftime('%H:%M:%S', time.gmtime())} {kind}")
            t = threading.Thread(target=self._guard, args=(kind, action), name=f"nemesis-{kind}", daemon=True)
            self.threads.append(t)
            t.start()

    def _claim(self, kind: str, pick: float, length: float):  # noqa: ANN202 - a closure or None
        """The fault to run now (its target taken), or None if none is free."""
        with self.lock:
            if kind.startswith("s3_"):
                if self.zk_busy:  # the metadata store's one fault at a time, as ZooKeeper's
                    return None
                self.zk_busy = True
                low, high = self.zk_pause
                return lambda: self._s3(kind, low + (high - low) * length, pick)
            if kind == "zk_pause":
                if self.zk_busy:
                    return None
                self.zk_busy = True
                low, high = self.zk_pause
                return lambda: self._zk_pause(low + (high - low) * length)
            if kind == "node_kill":
                if self.node_busy:
                    return None
                self.node_busy = True
                return lambda: self._node_kill(self.cluster.nodes[int(pick * 3)], 1.0 + 3.0 * length)
            free = [s for s in self.slots if not s.busy and s.running()]
            if not free or sum(s.busy for s in self.slots) >= 2:
                return None
            slot = free[int(pick * len(free))]
            slot.busy = True
        if kind == "kill":
            return lambda: self._member_restart(slot, signal.SIGKILL, 0.5 + 2.5 * length)
        if kind == "term":
            return lambda: self._member_restart(slot, signal.SIGTERM, 0.5 + 1.5 * length)
        return lambda: self._member_pause(slot, self.session + 1.0 + 3.0 * length)

    def _guard(self, kind: str, action) -> None:  # noqa: ANN001
        try:
            action()
        except Exception as exc:  # noqa: BLE001 - reported with the figures
            self.problems.append(f"{kind}: {type(exc).__name__}: {exc}")

    def _member_restart(self, slot: Slot, sig: int, down: float) -> None:
        try:
            proc = slot.proc
            proc.signal(sig)
            try:
                proc.wait(EXIT_TIMEOUT if sig == signal.SIGTERM else 30)
            except Exception:  # noqa: BLE001 - a member that does not exit on SIGTERM: a finding
                self.problems.append(f"member {proc.member_id} did not exit within {EXIT_TIMEOUT:g} s of SIGTERM")
                proc.kill()
            time.sleep(down)
            self._start(slot)
        finally:
            slot.busy = False

    def _start(self, slot: Slot) -> None:
        """Start a member on ``slot``; in an S3-only cluster, a start that fails (it could not
        read the cluster's metadata: an S3 fault window) is counted and tried again, up to
        ``START_DEADLINE``."""
        deadline = time.monotonic() + START_DEADLINE
        while True:
            try:
                slot.start()
                return
            except Exception as exc:  # noqa: BLE001 - counted; a problem only past the deadline
                if self.proxy is None or time.monotonic() > deadline:
                    raise
                self.failed_starts[type(exc).__name__] += 1
            time.sleep(1.0)

    def _member_pause(self, slot: Slot, seconds: float) -> None:
        try:
            slot.proc.signal(signal.SIGSTOP)
            time.sleep(seconds)
            slot.proc.signal(signal.SIGCONT)
        finally:
            slot.busy = False

    def _zk_pause(self, seconds: float) -> None:
        try:
            os.kill(self.zk.pid, signal.SIGSTOP)
            time.sleep(seconds)
        finally:
            os.kill(self.zk.pid, signal.SIGCONT)
            self.zk_busy = False

    def _s3(self, kind: str, seconds: float, pick: float) -> None:
        try:
            s3_window(self.proxy, kind, seconds, pick)
        finally:
            self.zk_busy = False

    def _node_kill(self, node, down: float) -> None:  # noqa: ANN001
        try:
            node.kill()
            time.sleep(down)
            node.start()
        finally:
            self.node_busy = False

    def heal(self) -> None:
        """Stop scheduling, let every fault end (each is bounded), and bring back anything down."""
        self.stop.set()
        for t in self.threads:
            t.join(EXIT_TIMEOUT + 60)
        if self.zk is not None:
            os.kill(self.zk.pid, signal.SIGCONT)
        if self.proxy is not None:
            self.proxy.clear()
        for node in getattr(self.cluster, "nodes", []):
            if node.proc is None or node.proc.poll() is not None:
                node.start()
        for slot in self.slots:
            if slot.proc is not None and slot.running():
                slot.proc.signal(signal.SIGCONT)
            else:
                self._start(slot)


def settle(cluster: Cluster | S3Cluster, slots: list[Slot], timeout: float = SETTLE_TIMEOUT) -> float:
    """Seconds until the three members are the only members, every partition is assigned to
    one of them (balanced) and each serves exactly the partitions assigned to it. A member
    that rejoined after its session ended has a new id: members are matched by address."""
    began = time.monotonic()
    deadline = began + timeout
    while True:
        try:
            view = cluster.view()
            by_address = {a: m for m, a in view["members"].items()}
            ids = {by_address.get(s.proc.uri) for s in slots}
            owners = [m for m, _g in view["assignment"].values()]
            counts = [owners.count(i) for i in ids]
            if (None not in ids and len(view["members"]) == len(slots) and len(owners) == PARTITIONS
                    and set(owners) <= ids and max(counts) - min(counts) <= 1
                    and all(s.proc.metric("sediment_cluster_partitions_owned") == owners.count(by_address[s.proc.uri])
                            for s in slots)):
                return time.monotonic() - began
        except Exception:  # noqa: BLE001 - a member or the metadata store still coming back: look again
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the cluster did not settle within {timeout:g} s")
        time.sleep(0.2)


def final_state(cluster: Cluster | S3Cluster, slots: list[Slot], top: int) -> tuple[dict, dict]:
    """Every relation sealed at ``top`` and read there: through the cluster's URI, and
    through each member's address."""
    def read_all(db) -> dict:  # noqa: ANN001
        out = {}
        for name in RELATIONS:
            snap = db.snapshot(name, top)
            out[name] = dict(zip(snap.column("k").to_pylist(), snap.column("diff").to_pylist(), strict=True))
        return out

    with sediment.connect(cluster.uri, token=TOKEN) as db:
        for name in RELATIONS:
            if db.sealed(name) < top:
                db.seal(name, top)
        final = read_all(db)
    members = {}
    for s in slots:
        with sediment.connect(s.proc.uri, token=TOKEN) as db:
            members[s.proc.uri] = read_all(db)
    return final, members


def report(f: Figures, nemesis: Nemesis, seed: int, seconds: float, settled: float, hung_threads: list[str],
           absorbed: Counter, kinds: dict[str, float] = KINDS) -> None:
    faults = ", ".join(f"{k} {nemesis.applied[k]}" for k in kinds)
    skipped = sum(nemesis.skipped.values())
    print(f"seed {seed}, {seconds:g} s: faults {sum(nemesis.applied.values())} ({faults}; {skipped} skipped: "
          f"target busy), settled {settled:.1f} s after the heal")
    o = f.outcomes
    calls = sum(f.errors.values())
    print(f"operations: appends {sum(o.values())} (acknowledged {o['ok']}, unknown {o['unknown']}, refused "
          f"{o['refused']}), reads {f.reads}, sealed {f.sealed}, seals acknowledged {f.seals}, typed errors {calls}"
          f" ({', '.join(f'{k} {v}' for k, v in f.errors.most_common())}), slowest call {f.slowest:.1f} s")
    print(f"single tries of appends that failed and were resent by the client: {sum(absorbed.values())} "
          f"({', '.join(f'{k} {v}' for k, v in absorbed.most_common())})")
    print("must be zero: " + ", ".join(f"{name} {getattr(f, name)}" for name in Figures.MUST_BE_ZERO)
          + f", untyped {sum(f.untyped.values())}" + (f" ({dict(f.untyped)})" if f.untyped else "")
          + f", unexpected {sum(f.unexpected.values())}" + (f" ({dict(f.unexpected)})" if f.unexpected else ""))
    for line in f.examples:
        print("  " + line)
    for line in nemesis.problems:
        print("  problem: " + line)
    if hung_threads:
        print(f"  hung client threads: {hung_threads}")


class Clients:
    """The client processes (bench/nemesis_client.py), started at once; ``connect``: how each
    reaches ``uri`` (None: ``sediment.connect``)."""

    def __init__(self, args: argparse.Namespace, tmp: Path, uri: str, token: str, connect=None) -> None:  # noqa: ANN001
        import multiprocessing

        self.args = args
        ctx = multiprocessing.get_context("spawn")
        self.event = ctx.Event()
        self.paths = [str(tmp / f"client{i}.json") for i in range(args.clients)]
        self.procs = [ctx.Process(target=nemesis_client.run, args=(i, uri, token, RELATIONS, args.seed, args.appenders,
                                                                   args.hang_bound, self.paths[i], self.event, connect))
                      for i in range(args.clients)]
        for p in self.procs:
            p.start()

    def stop(self, problems: list[str]) -> tuple:
        """Tell them to stop, wait (bounded: one that does not end is killed, a problem); their
        history as one, the hung threads and the errors the appends' retries went past."""
        self.event.set()
        for p in self.procs:
            p.join(self.args.hang_bound * nemesis_client.ATTEMPTS + 60)
            if p.is_alive():
                problems.append(f"client process {p.pid} did not end: killed")
                p.kill()
                p.join()
        return nemesis_client.load([p for p in self.paths if os.path.exists(p)])

    def missing(self) -> int:
        """Client processes that wrote no history (each counts as a violation)."""
        return len(self.paths) - sum(os.path.exists(p) for p in self.paths)


def span(text: str) -> tuple[float, float]:
    low, _, high = text.partition("-")
    return float(low), float(high or low)


def weights(args: argparse.Namespace, kinds: dict[str, float]) -> dict[str, float]:
    return {**kinds, **{k: float(v) for k, v in (w.split("=") for w in args.weights.split(",") if w)}}


def campaign(args: argparse.Namespace, tmp: Path, endpoint: str) -> int:
    """One run against the ZooKeeper cluster: the cluster, then :func:`run`."""
    zk = ZooKeeperServer(tmp / "zk")
    zk.start()
    cluster = None
    try:
        cluster = Cluster(tmp / "cluster", zk.hosts, "/nemesis", endpoint, "bench", partitions=PARTITIONS,
                          session_timeout=args.session_timeout)
        return run(args, tmp, cluster, Nemesis(cluster, [], zk, args.seed, args.session_timeout, span(args.interval),
                                               weights(args, KINDS), span(args.zk_pause)), expected_errors())
    finally:
        if cluster is not None:
            cluster.close()
        zk.stop()


def s3_campaign(args: argparse.Namespace, tmp: Path, endpoint: str) -> int:
    """One run against an S3-only cluster behind the fault proxy: the cluster, then :func:`run`."""
    with FaultyProxy(endpoint, serialize_conditional=True) as proxy:
        cluster = S3Cluster(tmp / "cluster", proxy.endpoint, "bench", partitions=PARTITIONS,
                            lease_time=args.lease_time)
        try:
            nemesis = Nemesis(cluster, [], None, args.seed, args.lease_time, span(args.interval),
                              weights(args, S3_KINDS), span(args.s3_fault), proxy)
            bad = run(args, tmp, cluster, nemesis, expected_errors() | STORE_UNAVAILABLE)
            faults = Counter(kind for _m, _p, kind in proxy.log.faults)
            print(f"restarts whose start failed, tried again: {dict(nemesis.failed_starts)}; S3 requests "
                  f"{len(proxy.log.requests)}, sabotaged {dict(faults)}")
            print(f"faults started (UTC, as the members' logs in --workdir): {', '.join(nemesis.timeline)}")
            return bad
        finally:
            cluster.close()


def run(args: argparse.Namespace, tmp: Path, cluster: Cluster | S3Cluster, nemesis: Nemesis, expected: set[str]) -> int:
    """The members, the clients, the nemesis, the heal and the check; violations."""
    slots = [Slot(cluster, f"member{i}") for i in range(3)]
    for s in slots:
        s.start()
    settle(cluster, slots)
    with sediment.connect(cluster.uri, token=TOKEN) as db:
        for i, name in enumerate(RELATIONS):
            db.add_relation(name, nemesis_client.SCHEMA, partition=i % PARTITIONS)
    clients = Clients(args, tmp, cluster.uri, TOKEN)
    nemesis.slots = slots
    began = time.monotonic()
    nemesis.run(args.seconds)
    nemesis.heal()
    print(f"nemesis ran {time.monotonic() - began:.0f} s; healed", flush=True)
    try:
        settled = settle(cluster, slots)
    except RuntimeError as exc:
        nemesis.problems.append(str(exc))
        settled = float("nan")
    history, hung, absorbed = clients.stop(nemesis.problems)
    top = max([a.time for a in history.appends], default=0) + 1
    final, members = final_state(cluster, slots, top)
    f = check(history, final, members, expected)
    report(f, nemesis, args.seed, args.seconds, settled, hung, absorbed, nemesis.weights)
    return f.violations() + len(nemesis.problems) + clients.missing()


@contextmanager
def moto_bucket(bucket: str) -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 in this process, with ``bucket`` made; its endpoint."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    try:
        host, port = moto.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
        yield endpoint
    finally:
        moto.stop()


def campaign_args(kinds: str, quick: str) -> argparse.ArgumentParser:
    """The options every nemesis campaign takes (this one's and bench/nemesis_s3.py's);
    ``kinds``: the default weights, for the help; ``quick``: what --quick means."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--quick", action="store_true", help=quick)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--clients", type=int, default=3, help="client processes")
    ap.add_argument("--appenders", type=int, default=2, help="appending threads (client ids) per client process")
    ap.add_argument("--weights", default="", help=f"KIND=WEIGHT,... to change how often each fault is chosen ({kinds})")
    ap.add_argument("--interval", default="1-4", help="seconds between the starts of two faults (uniform), MIN-MAX")
    ap.add_argument("--s3-fault", default="1-8", help="seconds an S3 fault window lasts (uniform), MIN-MAX")
    ap.add_argument("--hang-bound", type=float, default=60.0,
                    help="seconds a call may take before it counts as hung (the client's deadline is 30 s, plus "
                         "one call's 10 s timeout past it)")
    ap.add_argument("--workdir", help="keep the processes' files and logs here (default: a temporary directory)")
    return ap


def run_campaign(args: argparse.Namespace, bucket: str, run: Callable[..., int]) -> None:
    """Run ``run(args, workdir, endpoint)`` beside moto's S3 and exit 1 on any violation."""
    with moto_bucket(bucket) as endpoint, tempfile.TemporaryDirectory() as scratch:
        tmp = Path(args.workdir or scratch)
        tmp.mkdir(parents=True, exist_ok=True)
        bad = run(args, tmp, endpoint)
    print(f"load average {os.getloadavg()[0]:.1f}; {'FAILED: ' + str(bad) + ' violations' if bad else 'all held'}")
    sys.exit(1 if bad else 0)


def main() -> None:
    weights = (f"default {','.join(f'{k}={v}' for k, v in KINDS.items())}; with --membership s3 "
               f"{','.join(f'{k}={v}' for k, v in S3_KINDS.items())}")
    ap = campaign_args(weights, "30 s of faults")
    ap.add_argument("--membership", choices=("zk", "s3"), default="zk",
                    help="zk: the ZooKeeper cluster with storage nodes; s3: an S3-only cluster behind a fault proxy")
    ap.add_argument("--session-timeout", type=float, default=3.0)
    ap.add_argument("--lease-time", type=float, default=4.0, help="an S3-only cluster's lease time (seconds)")
    ap.add_argument("--zk-pause", default="1-4", help="seconds ZooKeeper stays SIGSTOPped (uniform), MIN-MAX")
    args = ap.parse_args()
    if args.quick:
        args.seconds = 30.0
    run_campaign(args, "bench", s3_campaign if args.membership == "s3" else campaign)


if __name__ == "__main__":
    main()
