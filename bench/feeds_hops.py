"""Where a feed's delivery over the network goes, hop by hop.

    .venv/bin/python bench/feeds_hops.py [--subscribers 100] [--appends 1000] [--rounds 3] [--modes network-async,network]

Why: ``bench/feeds.py`` gives the delivery p99 over the network against the append's p99;
to cut it one must know which hop holds it. The same case as its ``network`` and
``network-async`` modes (one writer in this process beside a ``SedimentFlightServer``,
subscriptions over 4 client processes), with timestamps (CLOCK_MONOTONIC, shared by the
processes) taken at each hop of an update, keyed by the update's time:

* ``feed``: the engine's durability callback (``FeedLog.add``) adds it to the feed;
* ``server``: a shared stream's thread has taken it and encoded its message (first per event
  and stream; the message is then handed to gRPC);
* ``client``: the client process's stream-reading thread has it from gRPC (first per event
  and client);
* ``task``: the subscriber's ``next()`` (or ``async for``) returns it (every delivery).

Prints p50 and p99 of each hop's share (submit to feed, feed to server, server to client,
client to task) and of the append itself.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

import feeds

from sediment.engine import feed as feed_module
from sediment.net import shared_feeds, shared_subscription


def _stamp_client() -> dict[int, float]:
    """Record when this client's stream readers first have each update (by time)."""
    seen: dict[int, float] = {}
    decode = shared_subscription.decode_event

    def timed(meta, data, *how):  # noqa: ANN001, ANN002, ANN202
        if meta.get("kind") == "updates":
            seen.setdefault(meta["time"], feeds.now())
        return decode(meta, data, *how)

    shared_subscription.decode_event = timed
    return seen


def _client(uri: str, token: str, n: int, appends: int, ready, results, in_loop: bool) -> None:  # noqa: ANN001
    seen = _stamp_client()
    box: list = []

    class Relay:
        def put(self, item) -> None:  # noqa: ANN001
            box.append(item)

    feeds._client(uri, token, n, appends, ready, Relay(), in_loop)
    received, cpu, wakes = box[0]
    results.put((received, cpu, wakes, seen))


def run(mode: str, subscribers: int, appends: int, root: str) -> dict:

    fed: list[float] = []  # callback time of each UPDATES event, in order: the writer's k-th append
    served: dict[int, float] = {}
    add, make = feed_module.FeedLog.add, shared_feeds.share_messages

    def timed_add(log, kind, lsn, time=0, written=-1):  # noqa: ANN001, ANN202
        if kind == feed_module.UPDATES:
            fed.append(feeds.now())
        return add(log, kind, lsn, time, written)

    def timed_messages(meta, parts):  # noqa: ANN001, ANN202
        if meta.get("kind") == "updates":
            served.setdefault(meta["time"], feeds.now())
        return make(meta, parts)

    feed_module.FeedLog.add, shared_feeds.share_messages = timed_add, timed_messages
    try:
        with feeds.fresh_engine(root, "sediment-bench-hops-") as eng:
            submitted, latency, sent, _cpu = feeds.run_clients(eng, _client, subscribers, appends,
                                                                 mode == "network-async")
    finally:
        feed_module.FeedLog.add, shared_feeds.share_messages = add, make
    # an update's time is its id + 1 (feeds.write)
    hops: dict[str, list[float]] = {"append": latency, "submit->feed": [], "feed->server": [],
                                    "server->client": [], "client->task": [], "delivery": []}
    for i, start in submitted.items():
        if i < len(fed):
            hops["submit->feed"].append(fed[i] - start)
            if i + 1 in served:
                hops["feed->server"].append(served[i + 1] - fed[i])
    for received, _, _, seen in sent:
        for t, at in seen.items():
            if t in served:
                hops["server->client"].append(at - served[t])
        for out in received:
            for i, at in out:
                hops["delivery"].append(at - submitted[i])
                if i + 1 in seen:
                    hops["client->task"].append(at - seen[i + 1])
    return {name: (feeds.pct(v, 50), feeds.pct(v, 99)) for name, v in hops.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--subscribers", type=int, default=100)
    ap.add_argument("--appends", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="network-async,network")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    args = ap.parse_args()
    modes = args.modes.split(",")
    got: dict[str, list[dict]] = {m: [] for m in modes}
    feeds.banner(args.subscribers, args.appends)
    for r in range(args.rounds):
        for mode in feeds.in_turn(modes, r):
            hops = run(mode, args.subscribers, args.appends, args.dir)
            got[mode].append(hops)
            print(f"round {r + 1} {mode}: " + ", ".join(f"{k} {p50 * 1e3:.2f}/{p99 * 1e3:.2f}"
                                                        for k, (p50, p99) in hops.items())
                  + f" ms (p50/p99), load {os.getloadavg()[0]:.1f}", flush=True)
    print("\n| path | hop | p50 ms | p99 ms |\n| --- | --- | --- | --- |")
    for mode in modes:
        for hop in got[mode][0]:
            p50s = [h[hop][0] * 1e3 for h in got[mode]]
            p99s = [h[hop][1] * 1e3 for h in got[mode]]
            print(f"| {mode} | {hop} | {statistics.median(p50s):.2f} ({min(p50s):.2f}-{max(p50s):.2f}) "
                  f"| {statistics.median(p99s):.2f} ({min(p99s):.2f}-{max(p99s):.2f}) |")


if __name__ == "__main__":
    main()
