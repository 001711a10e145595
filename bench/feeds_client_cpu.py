"""Where a client process's CPU goes per delivered update, over the network.

    .venv/bin/python bench/feeds_client_cpu.py [--subscribers 100] [--appends 1000] [--rounds 3] [--modes network-async,network] [--pace-ms MS]

Why: delivery over the network is bound by the client processes' CPU (8-16 us per delivery
on the same 2 cores as the writer and the server; docs/benchmarks.md, "Feed latency"); to
cut it one must know which part of a client's work costs it. The case of ``bench/feeds.py``'s
``network`` and ``network-async`` modes, with each client process's CPU split by thread
(``time.thread_time`` around each step, in the client processes only):

* ``receive``: the shared stream's reading thread inside the Flight reader's next message
  (gRPC's receive and the outer message's IPC decode, in C++);
* ``decode``: that thread decoding the event's table (``decode_event``: the inner IPC);
* ``hand``: the rest of that thread's work (the message's metadata, queueing the event for
  each subscription, waking the loop);
* ``deliver``: the subscribers' side: the event loop's thread (``network-async``) or the
  reader threads (``network``), the subscriber's own work (the benchmark's ``record``) in it;
* ``other``: the rest of the process (gRPC's own threads), from its process CPU.

Each in us per delivered update, summed over the 4 client processes, beside the server
process's CPU for the run and the delivery p99, median (min-max) over the rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time

import feeds

from sediment.net import shared_subscription

PARTS = ("receive", "decode", "hand", "deliver", "other")


def _instrument(spent: dict[str, float]) -> None:
    """Patch this client process so that each part's thread CPU adds up in ``spent``."""
    decode, pump = shared_subscription.decode_event, shared_subscription.SharedStream._pump

    def timed_decode(meta, data, *how):  # noqa: ANN001, ANN002, ANN202
        start = time.thread_time()
        try:
            return decode(meta, data, *how)
        finally:
            spent["decode"] += time.thread_time() - start

    class TimedReader:
        def __init__(self, reader) -> None:  # noqa: ANN001
            self._reader = reader

        def __iter__(self):  # noqa: ANN204
            it, began = iter(self._reader), time.thread_time()
            while True:
                start = time.thread_time()
                spent["pump"] = start - began  # the pump's thread so far (it runs on past the reads)
                try:
                    chunk = next(it)
                except StopIteration:
                    return
                finally:
                    spent["receive"] += time.thread_time() - start
                spent["messages"] += 1
                yield chunk

        def cancel(self) -> None:
            self._reader.cancel()

    def timed_pump(stream, reader) -> None:  # noqa: ANN001
        pump(stream, TimedReader(reader))

    shared_subscription.decode_event = timed_decode
    shared_subscription.SharedStream._pump = timed_pump


def _client(uri: str, token: str, n: int, appends: int, ready, results, in_loop: bool) -> None:  # noqa: ANN001
    spent = dict.fromkeys((*PARTS, "pump", "messages"), 0.0)
    _instrument(spent)
    read_feed = feeds.read_feed

    def timed_read_feed(sub, appends, out) -> None:  # noqa: ANN001
        start = time.thread_time()
        try:
            read_feed(sub, appends, out)
        finally:
            with lock:
                spent["deliver"] += time.thread_time() - start

    lock = threading.Lock()
    feeds.read_feed = timed_read_feed
    box: list = []
    began = [0.0]
    base: dict[str, float] = {}

    class Ready:
        def put(self, item) -> None:  # noqa: ANN001 - in the loop's thread (async) or the main thread
            began[0] = time.thread_time()
            base.update(spent)  # the snapshots' reads are not the run's
            ready.put(item)

    class Relay:
        def put(self, item) -> None:  # noqa: ANN001 - the main thread, the reads done
            if in_loop:
                spent["deliver"] += time.thread_time() - began[0]
            box.append(item)

    feeds._client(uri, token, n, appends, Ready(), Relay(), in_loop)
    received, cpu, _ = box[0]
    for part in ("receive", "decode", "pump", "messages"):
        spent[part] -= base[part]
    spent["hand"] = spent["pump"] - spent["receive"] - spent["decode"]
    spent["other"] = cpu - sum(spent[p] for p in PARTS if p != "other")
    results.put((received, {p: spent[p] for p in (*PARTS, "messages")}))


def run(mode: str, subscribers: int, appends: int, root: str) -> dict:
    with feeds.fresh_engine(root, "sediment-bench-client-cpu-") as eng:
        submitted, _latency, sent, cpu = feeds.run_clients(eng, _client, subscribers, appends, mode == "network-async")
    delivery = [at - submitted[i] for received, _ in sent for out in received for i, at in out]
    n = max(1, len(delivery))
    got = {p: sum(split[p] for _, split in sent) / n * 1e6 for p in PARTS}
    got["messages"] = sum(split["messages"] for _, split in sent) / len(sent) / appends
    got["server_s"] = cpu
    got["p99_ms"] = feeds.pct(delivery, 99) * 1e3
    got["missing"] = subscribers * appends - len(delivery)
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--subscribers", type=int, default=100)
    ap.add_argument("--appends", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="network-async,network")
    ap.add_argument("--pace-ms", type=float, default=0.0)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    args = ap.parse_args()
    feeds.PACE[0] = args.pace_ms / 1e3
    modes = args.modes.split(",")
    got: dict[str, list[dict]] = {m: [] for m in modes}
    feeds.banner(args.subscribers, args.appends)
    for r in range(args.rounds):
        for mode in feeds.in_turn(modes, r):
            row = run(mode, args.subscribers, args.appends, args.dir)
            got[mode].append(row)
            print(f"round {r + 1} {mode}: " + ", ".join(f"{p} {row[p]:.2f}" for p in PARTS)
                  + f" us/delivery; {row['messages']:.2f} messages per append and client, server {row['server_s']:.2f} s, delivery p99 {row['p99_ms']:.1f} ms, "
                  f"missing {row['missing']}, load {os.getloadavg()[0]:.1f}", flush=True)
    cols = (*PARTS, "messages", "server_s", "p99_ms")
    print("\n| path | " + " | ".join(cols) + " |\n| --- |" + " --- |" * len(cols))
    for mode in modes:
        cells = []
        for c in cols:
            vals = [row[c] for row in got[mode]]
            cells.append(f"{statistics.median(vals):.2f} ({min(vals):.2f}-{max(vals):.2f})")
        print(f"| {mode} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
