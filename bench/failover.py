"""A cluster of coordinators (issue 29): unavailability per failover, and append throughput
with 1, 2 and 3 coordinators.

Real processes as in tests/cluster/test_cluster.py: a ZooKeeper, moto's S3, three storage nodes,
``sediment serve --cluster`` members. Failover: writers append one row at a time to one
relation per partition; the owner of one partition is SIGKILLed (``--kills`` times), then
SIGTERMed (``--terms`` times), a client measures how long the partition went without an
acknowledged append, and a new member replaces the one gone; then every relation is checked
(nothing acknowledged lost, nothing twice). Each failover's steps are read back from the
members' logs (bench/failover_timeline.py). Throughput: a cluster grown from 1 to 3
members, each size measured with ``--writers`` single-row writers and with 8 writers of
1,000-row batches, over 8 relations, the writers spread over ``--client-procs`` client
processes; each figure beside its peer ("put": keyed appends as one do_put each, as before
the append stream carried keys; "stream": on the append stream), interleaved over
``--rounds`` rounds (median, min-max).

    python bench/failover.py [--kills 20] [--terms 10] [--session-timeout 3] [--seconds 5]
                             [--node-segment-mib 64] [--no-throughput] [--workdir DIR]
                             [--client-procs 4] [--rounds 3] [--modes put,stream] [--s3]

``--s3``: the failovers of an S3-only cluster instead (no ZooKeeper, no storage nodes;
membership by leases, ``--session-timeout`` being the lease time), without throughput.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import failover_timeline  # noqa: E402
import pyarrow as pa  # noqa: E402
from support.cluster_procs import TOKEN, Cluster, S3Cluster  # noqa: E402
from support.fixtures_zookeeper import ZooKeeperServer, four_letter_word  # noqa: E402

import sediment  # noqa: E402

SCHEMA = pa.schema([("k", pa.int64())])


def rows(first: int, n: int, t: int) -> pa.Table:
    return pa.table({"k": pa.array(range(first, first + n), pa.int64()), "time": pa.array([t] * n, pa.int64()),
                     "diff": pa.array([1] * n, pa.int64())})


class Writer(threading.Thread):
    """Appends ``batch`` rows at a time to ``name`` until stopped; acknowledgement times."""

    def __init__(self, db, name: str, batch: int = 1) -> None:
        super().__init__(daemon=True)
        self.db, self.name, self.batch = db, name, batch
        self.acks: list[tuple[float, float]] = []  # (sent, acknowledged)
        self.keys: list[int] = []
        self.errors: list[BaseException] = []
        self.halt = threading.Event()
        self.start()

    def run(self) -> None:
        k = 0
        while not self.halt.is_set():
            sent = time.monotonic()
            try:
                self.db.append(self.name, rows(k, self.batch, k + 1))
            except BaseException as exc:  # noqa: BLE001 - reported
                self.errors.append(exc)
                return
            self.keys.extend(range(k, k + self.batch))
            self.acks.append((sent, time.monotonic()))
            k += self.batch

    def first_ack_after(self, t0: float) -> float:
        """From ``t0`` to the acknowledgement of the first append sent after it (one in flight
        at ``t0`` may have been acknowledged by the killed owner just before it died)."""
        while not self.errors:
            later = [t for s, t in self.acks[-50:] if s > t0]
            if later:
                return later[0] - t0
            time.sleep(0.005)
        raise RuntimeError(self.errors[0])


def check(db, writers: list[Writer]) -> tuple[int, int]:
    """(acknowledged rows lost, rows present twice) over every writer's relation."""
    lost = dup = 0
    for w in writers:
        top = max(w.keys, default=0) + 2
        if db.sealed(w.name) < top:
            db.seal(w.name, top)
        snap = db.snapshot(w.name, top)
        got = dict(zip(snap.column("k").to_pylist(), snap.column("diff").to_pylist(), strict=True))
        lost += sum(1 for k in w.keys if got.get(k, 0) < 1)
        dup += sum(d - 1 for d in got.values() if d > 1)
    return lost, dup


def unavailable(writer: Writer, t0: float, sig: int, gone: float) -> tuple[float, float]:
    """SIGKILL: from the kill to the acknowledgement of the first append sent after it (one in
    flight at the kill may have been acknowledged by the owner just before it died). SIGTERM:
    the old owner goes on serving while it hands over, so the longest stretch without an
    acknowledgement from the signal to the first append sent after the process exited.
    Returns (unavailability, that first acknowledgement's time after the signal)."""
    base = t0 if sig == signal.SIGKILL else gone
    first = base + writer.first_ack_after(base)
    if sig == signal.SIGKILL:
        return first - t0, first - t0
    acks = sorted(t for _s, t in writer.acks[-5000:] if t0 <= t <= first)
    return max(b - a for a, b in zip([t0, *acks], [*acks, first], strict=False)), first - t0


def wait_served(cluster: Cluster, timeout: float = 60.0) -> None:
    """Until the assignment is balanced over the live members and each serves (has opened)
    exactly the partitions assigned to it: a member is never signalled mid-open."""
    deadline = time.monotonic() + timeout
    while True:
        live = cluster.live()
        owners = [m for m, _g in cluster.wait_assigned(live)["assignment"].values()]
        if all(m.metric("sediment_cluster_partitions_owned") == owners.count(m.member_id) for m in live):
            return
        assert time.monotonic() < deadline, "partitions not served within the timeout"
        time.sleep(0.05)


def failovers(cluster: Cluster, kills: int, terms: int) -> tuple[dict[int, list[float]], list[dict]]:
    """``kills`` SIGKILLs then ``terms`` SIGTERMs of a partition's owner, each replaced by a new
    member; unavailability per signal, and each failover's timeline from the members' logs."""
    for _ in range(3):
        cluster.start_member()
    wait_served(cluster)
    times: dict[int, list[float]] = {signal.SIGKILL: [], signal.SIGTERM: []}
    phases: list[dict] = []
    with sediment.connect(cluster.uri, token=TOKEN) as db:
        for p in range(4):
            db.add_relation(f"f{p}", SCHEMA, partition=p)
        writers = [Writer(db, f"f{p}") for p in range(4)]
        for i, sig in enumerate([signal.SIGKILL] * kills + [signal.SIGTERM] * terms):
            p = i % 4
            victim = cluster.owner_of(p)
            time.sleep(0.5)
            t0, wall = time.monotonic(), time.time()
            victim.signal(sig)
            victim.wait()
            took, acked = unavailable(writers[p], t0, sig, time.monotonic())
            times[sig].append(took)
            owner, generation = cluster.view()["assignment"][p]
            cluster.start_member()
            wait_served(cluster)
            settled = time.monotonic()
            for w in writers:  # every writer acknowledged again before the next signal
                w.first_ack_after(settled)
            phases.append({"signal": sig, **failover_timeline.timeline(
                [Path(m.log.name) for m in cluster.members], wall, wall + acked, victim.member_id, p, owner,
                generation, handover=sig == signal.SIGTERM)})
            print(f"{signal.Signals(sig).name} {i + 1}: partition {p} unavailable {took:.2f} s "
                  f"({', '.join(f'{k} {v:.2f}' for k, v in phases[-1].items() if isinstance(v, float))})",
                  flush=True)
        for w in writers:
            w.halt.set()
            w.join(60)
        lost, dup = check(db, writers)
        print(f"failover check: {sum(len(w.keys) for w in writers)} rows acknowledged, {lost} lost, {dup} twice, "
              f"errors {[str(e) for w in writers for e in w.errors]}", flush=True)
    return times, phases


class PutOnceClient:
    """The cluster client as it sent keyed appends before the append stream carried keys: one
    Flight ``do_put`` (the ``append_once`` op) per append, routed and retried the same way.
    The "before" peer of the throughput figures."""

    def __init__(self, uri: str) -> None:
        from sediment.cluster_client import ClusterClient

        self.cluster = ClusterClient(uri, TOKEN)
        self._flights: dict[str, object] = {}
        self._keys = threading.local()
        self._id = os.urandom(8).hex()
        self._count = iter(range(1, 1 << 30))

    def append(self, name: str, table: pa.Table) -> None:
        keys = self._keys
        if not hasattr(keys, "client"):
            keys.client, keys.seq = f"{self._id}-{next(self._count)}", 0
        keys.seq += 1
        key = (keys.client, keys.seq)
        self.cluster.route(name, lambda c: self._put(c.uri, name, table, key), retry_unknown=True,
                           unknown_outcome=True)

    def _put(self, uri: str, name: str, table: pa.Table, key: tuple[str, int]) -> None:
        import pyarrow.flight as flight

        from sediment.client import typed_error
        from sediment.net.messages import Put, encode
        from sediment.net.protocol import AUTH_HEADER

        client = self._flights.get(uri)
        if client is None:
            client = self._flights.setdefault(uri, flight.FlightClient(uri))
        options = flight.FlightCallOptions(headers=[(AUTH_HEADER.encode(), f"Bearer {TOKEN}".encode())])
        command = encode(Put.APPEND_ONCE, relation=name, client=key[0], seq=key[1])
        try:
            writer, _ = client.do_put(flight.FlightDescriptor.for_command(command), table.schema, options=options)
            writer.write_table(table)
            writer.close()
        except flight.FlightError as exc:
            raise typed_error(exc) from None

    def close(self) -> None:
        self.cluster.close()


def client_process(uri: str, mode: str, names: list[str], threads: int, batch: int, seconds: float,
                   ready, results) -> None:
    """One client process: ``threads`` writers on one client (``mode``: "stream", today's
    cluster client; "put", :class:`PutOnceClient`); the rows acknowledged in ``seconds``
    after every process is ready and warmed up."""
    os.environ["SEDIMENT_TOKEN"] = TOKEN
    db = sediment.connect(uri, token=TOKEN) if mode == "stream" else PutOnceClient(uri)
    ws = [Writer(db, names[i % len(names)], batch) for i in range(threads)]
    ready.wait()
    time.sleep(1.0)  # warm up: connections, streams
    before = sum(len(w.keys) for w in ws)
    time.sleep(seconds)
    done = sum(len(w.keys) for w in ws) - before
    for w in ws:
        w.halt.set()
    for w in ws:
        w.join(60)
    results.put((done, [str(e) for w in ws for e in w.errors]))
    db.close()


def measure(uri: str, mode: str, writers: int, batch: int, procs: int, seconds: float, names: list[str]) -> float:
    """Rows per second acknowledged to ``writers`` writers spread over ``procs`` client processes."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    ready, results = ctx.Barrier(procs + 1), ctx.Queue()
    per = [writers // procs + (1 if i < writers % procs else 0) for i in range(procs)]
    ps = [ctx.Process(target=client_process, args=(uri, mode, names[i::procs] or names, n, batch, seconds, ready,
                                                   results)) for i, n in enumerate(per) if n]
    for p in ps:
        p.start()
    ready.wait(timeout=120)
    got = [results.get(timeout=seconds + 120) for _ in ps]
    for p in ps:
        p.join(60)
    errors = [e for _n, errs in got for e in errs]
    if errors:
        raise RuntimeError(f"{mode} writers failed: {errors[:3]}")
    return sum(n for n, _e in got) / seconds


def throughput(cluster: Cluster, seconds: float, writers: int, procs: int, rounds: int,
               modes: tuple[str, ...]) -> list[tuple[int, str, list[float], list[float]]]:
    """Per cluster size and mode: single-row appends/s and rows/s in 1,000-row batches, one
    figure per round (modes interleaved within each round)."""
    out = []
    cluster.wait_assigned([cluster.start_member()])
    names = [f"t{r}" for r in range(8)]
    with sediment.connect(cluster.uri, token=TOKEN) as db:
        for r, name in enumerate(names):
            db.add_relation(name, SCHEMA, partition=r % 4)
    for size in (1, 2, 3):
        while len(cluster.live()) < size:
            cluster.start_member()
        cluster.wait_assigned(cluster.live())
        figures: dict[str, tuple[list[float], list[float]]] = {m: ([], []) for m in modes}
        for _ in range(rounds):
            for mode in modes:
                figures[mode][0].append(measure(cluster.uri, mode, writers, 1, procs, seconds, names))
                figures[mode][1].append(measure(cluster.uri, mode, 8, 1000, procs, seconds, names))
        for mode in modes:
            single, batched = figures[mode]
            out.append((size, mode, single, batched))
            print(f"{size} coordinators, {mode}: {statistics.median(single):.0f} single-row appends/s "
                  f"({min(single):.0f}-{max(single):.0f}), {statistics.median(batched):.0f} rows/s in 1,000-row "
                  f"batches ({min(batched):.0f}-{max(batched):.0f})", flush=True)
    return out


def throughput_in(cluster: Cluster, seconds: float, writers: int, procs: int, rounds: int,
                  modes: tuple[str, ...]) -> list[tuple[int, str, list[float], list[float]]]:
    try:
        return throughput(cluster, seconds, writers, procs, rounds, modes)
    finally:
        cluster.close()


def granted_timeouts(port: int, asked: float) -> str:
    """The session timeout ZooKeeper granted the members (its ``cons`` command lists every
    connection's): ``asked`` if some connection was granted it, else all that were granted."""
    got = sorted({int(w[3:]) / 1000 for w in four_letter_word(port, "cons").replace(",", " ").split()
                  if w.startswith("to=")})
    return f"{asked:g}" if asked in got else "/".join(f"{t:g}" for t in got) or "?"


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] if xs else float("nan")


def report(times: dict[int, list[float]], phases: list[dict], asked: float, granted: str) -> None:
    print("| signal | failovers | session timeout asked / granted | p50 | p99 | max |\n|---|---|---|---|---|---|")
    for sig, xs in times.items():
        if xs:
            print(f"| {signal.Signals(sig).name} | {len(xs)} | {asked:g} s / {granted} s | {statistics.median(xs):.2f} s "
                  f"| {percentile(xs, 0.99):.2f} s | {max(xs):.2f} s |")
    for sig in times:
        rows = [r for r in phases if r["signal"] == sig]
        if rows:
            print(f"\n{signal.Signals(sig).name}: where the time went\n{failover_timeline.summary(rows)}")
    print()


def failovers_on_s3(args: argparse.Namespace, endpoint: str) -> None:
    """The failovers of an S3-only cluster of four partitions; the lease time beside them."""
    with tempfile.TemporaryDirectory() as scratch:
        c = S3Cluster(Path(args.workdir or scratch) / "s3", endpoint, "bench", partitions=4,
                      lease_time=args.session_timeout)
        try:
            times, phases = failovers(c, args.kills, args.terms)
        finally:
            c.close()
    print(f"S3-only cluster, lease time {args.session_timeout:g} s (load {os.getloadavg()[0]:.1f})")
    report(times, phases, args.session_timeout, "lease")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--terms", type=int, default=10)
    ap.add_argument("--session-timeout", type=float, default=3.0)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--writers", type=int, default=64)
    ap.add_argument("--workdir", help="keep the processes' files and logs here (default: a temporary directory)")
    ap.add_argument("--node-segment-mib", type=int, default=64,
                    help="the storage nodes' --segment-bytes: a new owner replays what they still keep")
    ap.add_argument("--no-throughput", action="store_true", help="measure failovers only")
    ap.add_argument("--client-procs", type=int, default=4, help="client processes the writers are spread over")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="put,stream", help="keyed appends as one do_put each (put, before) "
                    "and on the append stream (stream)")
    ap.add_argument("--s3", action="store_true", help="an S3-only cluster (leases on S3), failovers only")
    args = ap.parse_args()
    from moto.server import ThreadedMotoServer

    # werkzeug, under moto's server, logs every request on stderr (its logger gets a handler at
    # INFO when it has none): thousands of lines around the summary. Its warnings still show.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    import boto3

    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench")
    if args.s3:
        failovers_on_s3(args, endpoint)
        moto.stop()
        return
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.workdir or scratch
        zk = ZooKeeperServer(Path(tmp) / "zk")
        zk.start()
        try:
            c = Cluster(Path(tmp) / "f", f"127.0.0.1:{zk.port}", "/failover", endpoint, "bench",
                        session_timeout=args.session_timeout,
                        node_args=("--segment-bytes", str(args.node_segment_mib << 20)))
            try:
                times, phases = failovers(c, args.kills, args.terms)
                granted = granted_timeouts(zk.port, args.session_timeout)
            finally:
                c.close()
            rates = [] if args.no_throughput else throughput_in(
                Cluster(Path(tmp) / "t", f"127.0.0.1:{zk.port}", "/throughput", endpoint, "bench",
                        session_timeout=args.session_timeout), args.seconds, args.writers, args.client_procs,
                args.rounds, tuple(args.modes.split(",")))
        finally:
            zk.stop()
            moto.stop()
    report(times, phases, args.session_timeout, granted)
    if not rates:
        return
    print(f"| coordinators | client | {args.writers} single-row writers, appends/s | 8 writers of 1,000-row "
          "batches, rows/s |")
    print("|---|---|---|---|")
    base = {mode: (statistics.median(single), statistics.median(batched))
            for size, mode, single, batched in rates if size == 1}
    for size, mode, single, batched in rates:
        s1, b1 = statistics.median(single), statistics.median(batched)
        print(f"| {size} | {mode} | {s1:.0f} ({min(single):.0f}-{max(single):.0f}; {s1 / base[mode][0]:.2f}x) | "
              f"{b1:.0f} ({min(batched):.0f}-{max(batched):.0f}; {b1 / base[mode][1]:.2f}x) |")


if __name__ == "__main__":
    main()
