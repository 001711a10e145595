"""Appends over the network (``sediment serve``'s Flight server) beside the same appends in process.

Why: issue 15's target is relative (served appends from 4 clients >= 0.8x the in-process
rows/s), and this machine is shared and noisy, so the peer is measured in the same run,
rounds interleaved, with the same rows:

* in process: N threads share one ``Engine`` and each calls ``engine.append`` with a
  1,000-row table of new ids every time (``id int64, payload binary`` plus ``time`` and
  ``diff``, ~100 B a row, random payloads: :class:`FreshTables`), durable on return, for
  ``--seconds``;
* served: the same engine options behind a ``SedimentFlightServer`` in this process, and N
  client *processes* (as Spark executors or other services would be), each with its own
  ``sediment.connect`` connection, appending tables made the same way for the same time;
* served, pipelined: the same client processes, each appending through
  ``client.pipelined("r", window=W)`` (up to W appends in flight on its stream, applied in
  order; rows count once acknowledged, the last ones collected before the clock stops);
* optionally (``--per-call``) the same with one do_put per append, the protocol before the
  append stream, and (``--client-threads``) the clients as threads of the server's process,
  where their Python work shares the server's interpreter lock.

Each case gets a fresh data directory (compaction on, as by default). N is 4 and 16;
each round runs every case once, in a rotated order, and the ratio of a round is
served / in-process rows/s of that round. Prints the median with min-max over the rounds,
and per case the CPU and context switches per append of this process (the server's, for
client processes) and of the client processes: counts that the machine's load moves little.
``--threads`` adds, per case, the CPU per append of this process's threads by role (polled from
``/proc/self/task`` every 10 ms, so threads that end within the case count too), the client
processes' main threads apart from their other threads, and how busy the host's cores were;
``--bare`` adds ``served-bare``: the same client processes against a server whose engine's
``append`` returns at once, writing nothing: what the transport and the handler cost per
append on their own, the floor of what a served append adds to the same append in process.
``--event-engine`` adds the served cases with client processes left on gRPC's event engine
(``GRPC_EXPERIMENTS`` empty: the client half of the build before inline polling,
sediment/net/grpc_setup.py); ``GRPC_EXPERIMENTS= .venv/bin/python bench/serve.py`` runs
everything, the server too, on gRPC's defaults.

    .venv/bin/python bench/serve.py                 # 3 rounds x 3 s per case, about 1.5 min
    .venv/bin/python bench/serve.py --serial        # also a server applying each stream's appends one at a time
    .venv/bin/python bench/serve.py --per-call      # also one do_put per append (the old protocol)
    .venv/bin/python bench/serve.py --client-threads  # also clients as threads of the server's process
    .venv/bin/python bench/serve.py --event-engine  # also clients on gRPC's event engine (the build before)
    .venv/bin/python bench/serve.py --threads --bare  # where the CPU goes, and the transport's own floor
    .venv/bin/python bench/serve.py --rounds 5 --seconds 4 --json out.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid

import pyarrow as pa
import pyarrow.compute as pc

import sediment
from sediment.net.messages import Put, encode

SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.binary())])
UPDATES = pa.schema([*SCHEMA, ("time", pa.int64()), ("diff", pa.int64())])
ROW_BYTES = 100
BATCH_ROWS = 1000
CLIENTS = (4, 16)


class FreshTables:
    """Writer ``k``'s appends: ``rows`` rows each, every id new (writer ``k``'s ids start at
    ``k << 40``), random payloads. The columns but the ids are made once; an append's ids
    are one Arrow addition, the same few microseconds on either side of the comparison."""

    def __init__(self, k: int, rows: int = BATCH_ROWS) -> None:
        blob = os.urandom((ROW_BYTES - 24) * rows)
        width = ROW_BYTES - 24
        self.rows = rows
        self.base = k << 40
        self.ids = pa.array(range(rows), pa.int64())
        self.rest = [pa.array([blob[i * width:(i + 1) * width] for i in range(rows)], pa.binary()),
                     pa.array([1] * rows, pa.int64()), pa.array([1] * rows, pa.int64())]
        self.made = 0

    def next(self) -> pa.Table:
        ids = pc.add(self.ids, pa.scalar(self.base + self.made * self.rows, pa.int64()))
        self.made += 1
        return pa.Table.from_arrays([ids, *self.rest], schema=UPDATES)


def group_mean(engine) -> float:
    """Records per group commit so far: concurrent appends joining one fdatasync raise it."""
    got = {s.name: s.value for metric in engine.metrics.group_commit.collect() for s in metric.samples}
    count = got.get("sediment_group_commit_records_count", 0.0)
    return got.get("sediment_group_commit_records_sum", 0.0) / count if count else 0.0


class ThreadCpu:
    """CPU of this process's threads by role over a case, and the host's busy cores. Threads
    are read every 10 ms (``/proc/self/task/*/schedstat``), so one that ends within the case
    counts up to its last reading; a thread is named once, when first seen (its Python name,
    else the kernel's: gRPC names its own threads)."""

    ROLES = (("(work)", "writer threads"), ("grpcpp_sync_ser", "gRPC server threads (handlers, engine appends)"),
             ("compaction", "compacter"), ("Trio thread", "compacter"), ("wal-", "log"),
             ("event_engine", "gRPC event engine"), ("grpc_global_tim", "gRPC timer"))

    def __init__(self) -> None:
        self._names: dict[int, str] = {}
        self._first: dict[int, int] = {}
        self._last: dict[int, int] = {}
        self._stop = threading.Event()
        self._host0 = self._host()
        self._read(self._first)
        self._thread = threading.Thread(target=self._poll, name="bench-thread-cpu", daemon=True)
        self._thread.start()

    @staticmethod
    def _host() -> list[int]:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:]]

    def _read(self, into: dict[int, int]) -> None:
        python = {t.native_id: t.name for t in threading.enumerate()}
        for tid in map(int, os.listdir("/proc/self/task")):
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    into[tid] = int(f.read().split()[0])
                if tid not in self._names:
                    with open(f"/proc/self/task/{tid}/comm") as f:
                        self._names[tid] = python.get(tid) or f.read().strip()
            except OSError:  # ended meanwhile
                pass

    def _poll(self) -> None:
        while not self._stop.wait(0.01):
            self._read(self._last)

    def stop(self, appends: int) -> str:
        """The split: microseconds of CPU per append by role, and the host's busy cores."""
        self._stop.set()
        self._thread.join()
        self._read(self._last)
        roles: dict[str, int] = {}
        for tid, ns in self._last.items():
            name = self._names.get(tid, "?")
            if name == "bench-thread-cpu":
                continue
            role = next((r for key, r in self.ROLES if key in name), "other (main, ended)")
            roles[role] = roles.get(role, 0) + ns - self._first.get(tid, 0)
        host = [b - a for a, b in zip(self._host0, self._host(), strict=True)]
        busy = (sum(host) - host[3] - host[4]) / max(1, sum(host)) * (os.cpu_count() or 1)
        parts = [f"{r} {ns / appends / 1e3:.0f}" for r, ns in sorted(roles.items(), key=lambda x: -x[1])
                 if ns / appends >= 500]
        return f"us of CPU per append here: {', '.join(parts)}; host cores busy {busy:.2f} of {os.cpu_count()}"


def finish(rows: int, elapsed: float, engine, cpu0: float, switches0: int, clients: list | None = None,
           threads: ThreadCpu | None = None) -> dict:
    """The case's figures: rows/s, records per group commit, this process's CPU and context
    switches per 1,000-row append (the server's alone when the clients are other processes)
    and, for client processes, theirs (``clients``: each one's CPU seconds, switches and its
    main thread's CPU seconds); with ``threads``, this process's split by thread."""
    appends = max(1, rows // BATCH_ROWS)
    got = {"rows": rows, "seconds": elapsed, "rows_s": rows / elapsed, "group": group_mean(engine),
           "cpu_us": (time.process_time() - cpu0) / appends * 1e6, "switches": (_switches() - switches0) / appends}
    if clients:
        got["client_cpu_us"] = sum(c[0] for c in clients) / appends * 1e6
        got["client_switches"] = sum(c[1] for c in clients) / appends
        got["client_main_us"] = sum(c[2] for c in clients) / appends * 1e6
    if threads is not None:
        got["threads"] = threads.stop(appends)
    return got


# --- in process ------------------------------------------------------------------------------


def run_in_process(root: str, writers: int, seconds: float, threads: bool = False) -> dict:
    d = tempfile.mkdtemp(prefix="sed-serve-inproc-", dir=root)
    try:
        with sediment.open(d) as engine:
            engine.add_relation("r", SCHEMA)
            counts = [0] * writers
            ready = threading.Barrier(writers + 1)
            deadline = [0.0]

            def work(k: int) -> None:
                tables = FreshTables(k)
                engine.append("r", tables.next())  # warm-up, not counted
                ready.wait()
                n = 0
                while time.perf_counter() < deadline[0]:
                    engine.append("r", tables.next())
                    n += BATCH_ROWS
                counts[k] = n

            workers = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(writers)]
            for t in workers:
                t.start()
            deadline[0] = time.perf_counter() + 3600
            ready.wait()
            split = ThreadCpu() if threads else None
            t0, cpu0, switches0 = time.perf_counter(), time.process_time(), _switches()
            deadline[0] = t0 + seconds
            for t in workers:
                t.join()
            got = finish(sum(counts), time.perf_counter() - t0, engine, cpu0, switches0, threads=split)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return got


# --- served ----------------------------------------------------------------------------------


def _client(uri: str, token: str, k: int, ready, go, seconds: float, out, how: str, window: int) -> None:
    """One client process: connect, warm up, wait for the start, append until the deadline.
    ``how``: ``served`` (``client.append``), ``pipelined`` (``client.pipelined``, ``window``
    in flight) or ``per-call`` (one do_put per append, the protocol before the append stream,
    which the server still serves, through the client's own per-call path); with ``-ee``, the
    client keeps gRPC's event engine (``GRPC_EXPERIMENTS`` empty: gRPC's defaults, the build
    before inline polling). Reports its rows, start, end, CPU seconds and context switches."""
    if how.endswith("-ee"):
        os.environ["GRPC_EXPERIMENTS"] = ""  # read at gRPC's first use in this process, just below
        how = how.removesuffix("-ee")
    client = sediment.connect(uri, token)
    if how == "per-call":
        command = encode(Put.APPEND, relation="r", txn=None)
        client.append = lambda name, table: client._put(command, table)  # noqa: SLF001 - the old path, measured
    try:
        tables = FreshTables(k)
        client.append("r", tables.next())
        ready.put(k)
        go.wait()
        cpu0, switches0, main0 = time.process_time(), _switches(), time.thread_time()
        t0 = time.perf_counter()
        deadline = t0 + seconds
        if how == "pipelined":
            with client.pipelined("r", window=window) as writer:
                while time.perf_counter() < deadline:
                    writer.append(tables.next())
            n = writer.acknowledged * BATCH_ROWS
        else:
            n = 0
            while time.perf_counter() < deadline:
                client.append("r", tables.next())
                n += BATCH_ROWS
        out.put((n, t0, time.perf_counter(), time.process_time() - cpu0, _switches() - switches0,
                 time.thread_time() - main0))
    finally:
        client.close()


def _switches() -> int:
    """This process's context switches so far (all threads, voluntary and not)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_nvcsw + usage.ru_nivcsw


def run_served_threads(root: str, clients: int, seconds: float) -> dict:
    """The served case with the clients as threads of this process (each with its own
    connection): client and server share one interpreter, as in ``serve_local``."""
    from sediment.server import SedimentFlightServer

    d = tempfile.mkdtemp(prefix="sed-serve-thr-", dir=root)
    token = uuid.uuid4().hex
    try:
        with sediment.open(d) as engine:
            engine.add_relation("r", SCHEMA)
            server = SedimentFlightServer(engine, "grpc://127.0.0.1:0", token)
            try:
                counts = [0] * clients
                ready = threading.Barrier(clients + 1)
                deadline = [time.perf_counter() + 3600]

                def work(k: int) -> None:
                    with sediment.connect(server.uri, token) as client:
                        tables = FreshTables(k)
                        client.append("r", tables.next())
                        ready.wait()
                        n = 0
                        while time.perf_counter() < deadline[0]:
                            client.append("r", tables.next())
                            n += BATCH_ROWS
                        counts[k] = n

                threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(clients)]
                for t in threads:
                    t.start()
                ready.wait()
                t0, cpu0, switches0 = time.perf_counter(), time.process_time(), _switches()
                deadline[0] = t0 + seconds
                for t in threads:
                    t.join()
                got = finish(sum(counts), time.perf_counter() - t0, engine, cpu0, switches0)
            finally:
                server.stop(grace=10)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return got


class SerialStreams:
    """The engine as a server sees it, without ``append_queued``: the server then applies a
    stream's appends one after the other, each acknowledged before the next is read (the
    append stream before session 12), for the ``-serial`` peers of ``--serial``."""

    def __init__(self, engine) -> None:
        self._engine = engine

    def __getattr__(self, name: str):
        if name == "append_queued":
            raise AttributeError(name)
        return getattr(self._engine, name)


class BareAppends:
    """The engine as a server sees it, with an ``append`` that returns at once and writes
    nothing (the ``served-bare`` case): what is left of a served append is the clients'
    work, gRPC, Flight and the server's handler."""

    def __init__(self, engine) -> None:
        self._engine = engine

    def append(self, name: str, updates: pa.Table, *, locks=None) -> None:
        return None

    def __getattr__(self, name: str):
        return getattr(self._engine, name)


def run_served(root: str, clients: int, seconds: float, how: str = "served", window: int = 8,
               threads: bool = False) -> dict:
    from sediment.server import SedimentFlightServer

    d = tempfile.mkdtemp(prefix="sed-serve-net-", dir=root)
    token = uuid.uuid4().hex
    ctx = mp.get_context("spawn")  # the parent runs gRPC threads: never fork it
    serial, bare = how.endswith("-serial"), how.endswith("-bare")
    how = how.replace("-serial", "").replace("-bare", "")
    try:
        with sediment.open(d) as engine:
            engine.add_relation("r", SCHEMA)
            served = SerialStreams(engine) if serial else BareAppends(engine) if bare else engine
            server = SedimentFlightServer(served, "grpc://127.0.0.1:0", token)
            try:
                ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
                procs = [ctx.Process(target=_client, args=(server.uri, token, k, ready, go, seconds, out, how, window),
                                     daemon=True) for k in range(clients)]
                for p in procs:
                    p.start()
                for _ in procs:
                    ready.get(timeout=120)
                split = ThreadCpu() if threads else None
                cpu0, switches0 = time.process_time(), _switches()
                go.set()
                results = [out.get(timeout=seconds + 120) for _ in procs]
                rows = sum(r[0] for r in results)
                elapsed = max(r[2] for r in results) - min(r[1] for r in results)
                got = finish(rows, elapsed, engine, cpu0, switches0, [r[3:] for r in results], split)
                for p in procs:
                    p.join(timeout=60)
            finally:
                server.stop(grace=10)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return got


# --- the run ---------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--clients", default=",".join(map(str, CLIENTS)), help="comma-separated client counts")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the data directories go")
    parser.add_argument("--per-call", action="store_true",
                        help="also measure one do_put per append (the protocol before the append stream)")
    parser.add_argument("--client-threads", action="store_true",
                        help="also measure served appends from client threads inside this process")
    parser.add_argument("--window", type=int, default=8, help="appends in flight per pipelined client")
    parser.add_argument("--serial", action="store_true",
                        help="also measure the served paths with the server applying a stream's appends one "
                             "after the other (the append stream before session 12)")
    parser.add_argument("--event-engine", action="store_true",
                        help="also measure the served paths with client processes on gRPC's event engine (gRPC's "
                             "defaults, the client half of the build before inline polling; sediment/net/grpc_setup.py)")
    parser.add_argument("--threads", action="store_true",
                        help="also print each case's CPU per append by thread (this process's roles, the clients' "
                             "main threads) and the host's busy cores")
    parser.add_argument("--bare", action="store_true",
                        help="also measure served appends against a server whose engine's append writes nothing "
                             "(the transport's and the handler's own CPU)")
    parser.add_argument("--json", default=None, metavar="FILE")
    args = parser.parse_args()
    counts = [int(c) for c in args.clients.split(",")]
    modes = ("in-process", "served", "pipelined", *(("per-call",) if args.per_call else ()),
             *(("served-threads",) if args.client_threads else ()),
             *(("served-serial", "pipelined-serial") if args.serial else ()),
             *(("served-ee", "pipelined-ee") if args.event_engine else ()),
             *(("served-bare",) if args.bare else ()))
    results: dict[tuple[str, int], list[float]] = {(mode, n): [] for n in counts for mode in modes}
    print(f"python {platform.python_version()}, pyarrow {pa.__version__}, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.1f}; {BATCH_ROWS}-row batches of ~{ROW_BYTES} B rows, "
          f"{args.seconds:g} s per case", flush=True)
    for r in range(args.rounds):
        # each writer count's cases run back to back (so a ratio compares runs seconds apart,
        # not minutes), in an order rotated every round
        order = [(mode, n) for n in counts for mode in modes[r % len(modes):] + modes[:r % len(modes)]]
        for mode, n in order:
            if mode == "in-process":
                got = run_in_process(args.dir, n, args.seconds, args.threads)
            elif mode == "served-threads":
                got = run_served_threads(args.dir, n, args.seconds)
            else:
                got = run_served(args.dir, n, args.seconds, how=mode, window=args.window, threads=args.threads)
            results[(mode, n)].append(got["rows_s"])
            clients = (f", clients {got['client_cpu_us']:.0f} us (main threads {got['client_main_us']:.0f}) and "
                       f"{got['client_switches']:.1f} switches" if "client_cpu_us" in got else "")
            print(f"round {r + 1}: {mode:12s} {n:2d} writers: {got['rows_s'] / 1e3:8.1f}k rows/s, "
                  f"{got['group']:.1f} records per group commit, per append: {got['cpu_us']:.0f} us CPU and "
                  f"{got['switches']:.1f} context switches here{clients}, load {os.getloadavg()[0]:.1f}", flush=True)
            if "threads" in got:
                print(f"    {got['threads']}", flush=True)
    summary = []
    print()
    print("| writers | path | rows/s, median (min-max) | / in process, median (min-max) |")
    print("| ---: | --- | ---: | ---: |")
    for n in counts:
        local = results[("in-process", n)]
        for mode in modes:
            got = results[(mode, n)]
            ratios = [g / i for g, i in zip(got, local, strict=True)]
            summary.append({"writers": n, "mode": mode, "rows_s": got, "ratios": ratios})
            print(f"| {n} | {mode} | {statistics.median(got) / 1e3:.0f}k ({min(got) / 1e3:.0f}-{max(got) / 1e3:.0f}k) "
                  f"| {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"batch_rows": BATCH_ROWS, "row_bytes": ROW_BYTES, "seconds": args.seconds,
                       "results": summary}, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
