"""Feed latency: from a durable append's submission to its delivery on every subscriber.

    .venv/bin/python bench/feeds.py                       # 3 rounds; 1, 10, 100, 1000 subscribers
    .venv/bin/python bench/feeds.py --quick               # 1 round, 300 appends, no 1000
    .venv/bin/python bench/feeds.py --counts 1,10,100 --rounds 5 --modes in-process
    .venv/bin/python bench/feeds.py --counts 100 --modes network-async --pace-ms 2   # one append every 2 ms

One writer appends single-row updates, each waiting for durability, and N subscribers
read the feed. Three ways to subscribe, as peers in the same rounds (order rotated every
round, a fresh data directory per case):

* ``in-process``: N threads, each with its own ``Engine.subscribe``;
* ``in-process-async``: N tasks in one asyncio event loop (one thread), each iterating its
  own ``Engine.subscribe`` with ``async for``;
* ``network``: a ``SedimentFlightServer`` on the same engine in this process, and the N
  subscribers spread over 4 client processes, each a ``sediment.connect(...).subscribe``
  read by a thread of its own;
* ``network-async``: the same, each client process reading its subscriptions as tasks of
  one asyncio event loop (``async for``).

For every update the script records the append's own latency (submit to acknowledged)
and each subscriber's delivery latency (submit to ``next()`` returning it; the clock is
CLOCK_MONOTONIC, shared by the processes). A subscriber can receive an update before
the writer's call returns (the feed is fed by the durability callback). Target: p99
delivery <= 2x the append's own p99 with 100 subscribers (issue 27). Prints, per case,
the median over the rounds with min-max, and the process's CPU per delivered update (CPU
moves less with the machine's load than latency does); over the network also the client
processes' CPU per delivered update (their reading phase, summed over the 4).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import os
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from array import array
from itertools import repeat

import pyarrow as pa

import sediment

SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.binary())])
UPDATE_SCHEMA = SCHEMA.append(pa.field("time", pa.int64())).append(pa.field("diff", pa.int64()))
CLIENT_PROCESSES = 4


def now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))] if values else float("nan")


Received = tuple[array, array]  # (ids, times received): flat arrays, which the garbage collector never walks


def received_slot() -> Received:
    return array("q"), array("d")


def record(event, out: Received) -> int:
    """Note an update event's ids with the time now; returns how many (0 for other events).
    Into flat arrays: a list of tuples per subscriber (100,000 entries for 100 subscribers and
    1,000 appends) made each of Python's full collections walk them, a pause of the
    measurement's own in the delivery figures."""
    at = now()
    if event.kind != "updates":
        return 0
    ids = event.table.column("id").to_pylist()
    out[0].extend(ids)
    out[1].extend(repeat(at, len(ids)))
    return len(ids)


def read_feed(sub, appends: int, out: Received) -> None:
    """What a user writes: iterate the subscription, until ``appends`` ids have come,
    recording (id, time received)."""
    got = 0
    for event in sub:
        got += record(event, out)
        if got >= appends:
            return


PACE = [0.0]  # seconds between the appends' starts (--pace-ms); 0: back to back


def write(eng, appends: int) -> tuple[dict[int, float], list[float]]:
    """``appends`` one-row appends, back to back or one every PACE[0] seconds: back to back,
    a build whose appends get faster also makes its subscribers' work come faster, which on 2
    cores can queue up at the slowest reader; paced, both builds deliver the same rate."""
    submitted: dict[int, float] = {}
    latency: list[float] = []
    due = now()
    for i in range(appends):
        table = pa.table({"id": [i], "payload": [b"x" * 76], "time": [i + 1], "diff": [1]}, schema=UPDATE_SCHEMA)
        if PACE[0]:
            due += PACE[0]
            while (left := due - now()) > 0:
                time.sleep(left)
        start = now()
        submitted[i] = start
        eng.append("r", table)
        latency.append(now() - start)
    return submitted, latency


def run_in_process(eng, subscribers: int, appends: int) -> tuple[dict[int, float], list[float], list]:
    """``subscribers`` threads; with 0, the appends alone (the append's p99 without a feed)."""
    subs = [eng.subscribe("r") for _ in range(subscribers)]
    for s in subs:
        s.next(timeout=5)  # the snapshot
    received = [received_slot() for _ in subs]
    threads = [threading.Thread(target=read_feed, args=(s, appends, out), daemon=True)
               for s, out in zip(subs, received, strict=True)]
    for th in threads:
        th.start()
    submitted, latency = write(eng, appends)
    for th in threads:
        th.join(timeout=300)
    for s in subs:
        s.close()
    return submitted, latency, received


async def read_feed_async(sub, appends: int, out: Received) -> None:
    """:func:`read_feed` as a task: ``async for`` over the subscription."""
    got = 0
    async for event in sub:
        got += record(event, out)
        if got >= appends:
            return


def run_in_process_async(eng, subscribers: int, appends: int) -> tuple[dict[int, float], list[float], list]:
    """``subscribers`` tasks in one event loop, run by one thread."""
    subs = [eng.subscribe("r") for _ in range(subscribers)]
    for s in subs:
        s.next(timeout=5)  # the snapshot
    received = [received_slot() for _ in subs]
    started = threading.Event()

    async def read_all() -> None:
        tasks = [asyncio.ensure_future(read_feed_async(s, appends, out)) for s, out in zip(subs, received, strict=True)]
        await asyncio.sleep(0)
        started.set()
        await asyncio.gather(*tasks)

    loop_thread = threading.Thread(target=asyncio.run, args=(read_all(),), daemon=True)
    loop_thread.start()
    started.wait(60)
    submitted, latency = write(eng, appends)
    loop_thread.join(timeout=300)
    for s in subs:
        s.close()
    return submitted, latency, received


def _client(uri: str, token: str, n: int, appends: int, ready, results, in_loop: bool = False) -> None:
    """One client process: ``n`` subscriptions, a reader thread each (``in_loop``: tasks of one
    event loop); sends back what came when, the CPU it spent reading and how many times the
    stream's reading thread woke the loop."""
    client = sediment.connect(uri, token)
    subs = [client.subscribe("r") for _ in range(n)]
    for s in subs:
        s.next(timeout=60)  # the snapshot
    received = [received_slot() for _ in subs]
    cpu, wakes = time.process_time(), [0]
    if in_loop:
        async def read_all() -> None:
            loop = asyncio.get_running_loop()
            real = loop.call_soon_threadsafe

            def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - each wake-up runs as before
                wakes[0] += 1
                return real(*args, **kwargs)

            loop.call_soon_threadsafe = counted
            tasks = [asyncio.ensure_future(asyncio.wait_for(read_feed_async(s, appends, out), 300))
                     for s, out in zip(subs, received, strict=True)]
            await asyncio.sleep(0)
            ready.put(n)
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run(read_all())
    else:
        threads = [threading.Thread(target=read_feed, args=(s, appends, out), daemon=True)
                   for s, out in zip(subs, received, strict=True)]
        for th in threads:
            th.start()
        ready.put(n)
        for th in threads:
            th.join(timeout=300)
    results.put((received, time.process_time() - cpu, wakes[0]))
    for s in subs:
        s.close()
    client.close()


def run_clients(eng, client, subscribers: int, appends: int, in_loop: bool) -> tuple[dict[int, float], list[float],
                                                                                 list, float]:
    """Serve ``eng`` on loopback, start ``client`` in up to CLIENT_PROCESSES spawned processes
    that share the ``subscribers`` (its arguments: uri, token, its share, appends, the ready and
    results queues, ``in_loop``), and append once every one is ready: the appends' submit times
    and latencies, each process's result, and this process's CPU from the first append to the
    last result."""
    from sediment.server import SedimentFlightServer

    token = uuid.uuid4().hex
    server = SedimentFlightServer(eng, "grpc://127.0.0.1:0", token)
    ctx = mp.get_context("spawn")  # this process runs gRPC threads: never fork it
    try:
        ready, results = ctx.Queue(), ctx.Queue()
        shares = [subscribers // CLIENT_PROCESSES + (k < subscribers % CLIENT_PROCESSES)
                  for k in range(min(CLIENT_PROCESSES, subscribers))]
        procs = [ctx.Process(target=client, args=(server.uri, token, n, appends, ready, results, in_loop),
                             daemon=True) for n in shares]
        for p in procs:
            p.start()
        for _ in procs:
            ready.get(timeout=300)
        cpu = time.process_time()
        submitted, latency = write(eng, appends)
        sent = [results.get(timeout=600) for _ in procs]
        cpu = time.process_time() - cpu
        for p in procs:
            p.join(timeout=60)
    finally:
        server.stop(grace=10)
    return submitted, latency, sent, cpu


def run_network(eng, subscribers: int, appends: int, in_loop: bool = False) -> tuple[dict[int, float], list[float],
                                                                                    list, float]:
    """4 client processes; the fourth item: their CPU and their loops' wake-ups, each summed."""
    submitted, latency, sent, _cpu = run_clients(eng, _client, subscribers, appends, in_loop)
    return (submitted, latency, [out for outs, _, _ in sent for out in outs],
            (sum(cpu for _, cpu, _ in sent), sum(wakes for _, _, wakes in sent)))


MODES = {"in-process": run_in_process, "in-process-async": run_in_process_async, "network": run_network,
         "network-async": lambda eng, n, appends: run_network(eng, n, appends, in_loop=True)}


@contextlib.contextmanager
def fresh_engine(root: str, prefix: str):
    """An engine in a new directory under ``root`` (removed after), compaction off, with the
    relation ``r`` sealed through 0."""
    data = tempfile.mkdtemp(prefix=prefix, dir=root)
    try:
        with sediment.open(data, compact=False) as eng:
            eng.add_relation("r", SCHEMA)
            eng.seal("r", 0)
            yield eng
    finally:
        shutil.rmtree(data, ignore_errors=True)


def run(mode: str, subscribers: int, appends: int, root: str) -> dict:
    with fresh_engine(root, "sediment-bench-feeds-") as eng:
        cpu = time.process_time()
        submitted, latency, received, *clients = MODES[mode](eng, subscribers, appends)
        client_cpu, wakes = clients[0] if clients else (0.0, 0)
        cpu = time.process_time() - cpu
    delivery = [at - submitted[i] for ids, ats in received for i, at in zip(ids, ats, strict=True)]
    missing = subscribers * appends - len(delivery)
    delivery = delivery or [0.0]
    return {"append_p99": pct(latency, 99), "delivery_p50": pct(delivery, 50),
            "delivery_p99": pct(delivery, 99), "missing": missing,
            "cpu_us": cpu / max(1, len(delivery) if subscribers else appends) * 1e6,
            "client_cpu_us": client_cpu / max(1, len(delivery)) * 1e6,
            "loop_wakes": wakes / appends / min(CLIENT_PROCESSES, subscribers or 1)}


def banner(subscribers: int, appends: int, extra: str = "") -> None:
    """The run's first line: the host's cores and load, and what each case does."""
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; {subscribers} subscribers, {appends} appends{extra}",
          flush=True)


def in_turn(modes: list[str], r: int) -> list[str]:
    """``modes`` in round ``r``'s order: each round starts one further along, so no mode
    always runs first after the previous round."""
    return modes[r % len(modes):] + modes[:r % len(modes)]


def spread(values: list[float], scale: float = 1.0, fmt: str = ".2f") -> str:
    return (f"{statistics.median(values) * scale:{fmt}} "
            f"({min(values) * scale:{fmt}}-{max(values) * scale:{fmt}})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--appends", type=int, default=1000)
    ap.add_argument("--counts", default="0,1,10,100,1000",
                    help="subscriber counts; 0 runs the appends alone, in process only")
    ap.add_argument("--modes", default="in-process,in-process-async,network,network-async")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--pace-ms", type=float, default=0.0, help="one append every so many ms (default: back to back)")
    args = ap.parse_args()
    PACE[0] = args.pace_ms / 1e3
    counts = [int(c) for c in ("0,1,10,100" if args.quick else args.counts).split(",")]
    rounds, appends = (1, 300) if args.quick else (args.rounds, args.appends)
    modes = args.modes.split(",")
    results: dict[tuple[str, int], list[dict]] = {(m, n): [] for m in {*modes, "in-process"} for n in counts}
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; {appends} one-row appends per case", flush=True)
    for r in range(rounds):
        for n in counts:
            for mode in in_turn(modes, r) if n else ["in-process"]:
                got = run(mode, n, appends, args.dir)
                results[(mode, n)].append(got)
                print(f"round {r + 1}: {mode:16s} {n:5d} subscribers: append p99 {got['append_p99'] * 1e3:.2f} ms, "
                      f"delivery p50 {got['delivery_p50'] * 1e3:.2f} ms p99 {got['delivery_p99'] * 1e3:.2f} ms, "
                      f"{got['delivery_p99'] / got['append_p99']:.2f}x, missing {got['missing']}, "
                      f"CPU {got['cpu_us']:.1f} us/delivery, clients' {got['client_cpu_us']:.1f} us, "
                      f"loop wake-ups per append and client {got['loop_wakes']:.2f}, "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)
    print("\n| subscribers | path | append p99 ms | delivery p50 ms | delivery p99 ms | p99 / append p99 "
          "| CPU us per delivery | clients' CPU us per delivery |")
    print("| ---: | --- | --- | --- | --- | --- | --- | --- |")
    for n in counts:
        for mode in modes if n else ["in-process"]:
            rows = results[(mode, n)]
            ratios = [g["delivery_p99"] / g["append_p99"] for g in rows]
            print(f"| {n} | {mode} | {spread([g['append_p99'] for g in rows], 1e3)} | "
                  f"{spread([g['delivery_p50'] for g in rows], 1e3)} | {spread([g['delivery_p99'] for g in rows], 1e3)} "
                  f"| {spread(ratios)}x | {spread([g['cpu_us'] for g in rows], fmt='.1f')} "
                  f"| {spread([g['client_cpu_us'] for g in rows], fmt='.1f')} |")


if __name__ == "__main__":
    main()
