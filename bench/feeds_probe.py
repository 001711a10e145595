"""Where a feed's delivery latency goes, in process: the append's part and the feed's part.

    .venv/bin/python bench/feeds_probe.py [--subscribers 100] [--appends 500] [--rounds 3] [--switch-interval MS]
                                          [--modes in-process,in-process-async]

Why: ``bench/feeds.py`` gives the delivery p99 against the append's p99; before changing the
feed, this splits each delivery into the time from submission to the feed's durability
callback (``FeedLog.add``, which the append pays too) and the time from that callback to the
subscriber's ``next()`` returning the update (the feed's own part: the relay's wake-ups and
the take). It also counts the subscribers' wake-ups per delivered update, the intervals
between successive hand-ons of the relay (how fast one turn of the relay goes round), and
how many deliveries the worst stalls held up at once. The same case as ``bench/feeds.py``'s
in-process one (one writer, N subscriber threads, a fresh data directory per round).
With ``--modes in-process,in-process-async`` each round also runs the subscribers as tasks
of one event loop (the two alternated), and counts the loop's wake-ups (resumes) per append.
``--switch-interval`` sets the interpreter's switch interval in this process only, to see
whether it is what makes the p99 (the library never changes it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

import feeds

import sediment
from sediment.engine import feed as feed_module
from sediment.engine import feed_async


class Probe:
    """Timestamps of the feed's callbacks and of the relay's hand-ons, taken by wrapping the
    two public entry points the writer and the woken subscribers go through."""

    def __init__(self) -> None:
        self.added: list[float] = []  # callback time of each UPDATES event, in order
        self.hand_ons: list[float] = []
        self.resumes = 0  # event loop wake-ups (async subscribers)
        self._add = feed_module.FeedLog.add
        self._settle = feed_module.FeedLog.settle
        self._resume = feed_async.LoopWaiters.resume

    def __enter__(self) -> Probe:
        probe, add, settle, resume = self, self._add, self._settle, self._resume

        def timed_add(log, kind, lsn, time=0, written=-1):  # noqa: ANN001, ANN202
            if kind == feed_module.UPDATES:
                probe.added.append(feeds.now())
            return add(log, kind, lsn, time, written)

        def timed_settle(log, sub, forget=False):  # noqa: ANN001, ANN202
            if not sub.sleeping:  # woken by the relay: it hands on now
                probe.hand_ons.append(feeds.now())
            return settle(log, sub, forget)

        def counted_resume(waiters):  # noqa: ANN001, ANN202
            probe.resumes += 1
            return resume(waiters)

        feed_module.FeedLog.add, feed_module.FeedLog.settle = timed_add, timed_settle
        feed_async.LoopWaiters.resume = counted_resume
        return self

    def __exit__(self, *exc: object) -> None:
        feed_module.FeedLog.add, feed_module.FeedLog.settle = self._add, self._settle
        feed_async.LoopWaiters.resume = self._resume


def one_round(subscribers: int, appends: int, root: str, mode: str = "in-process") -> dict[str, float]:
    data = tempfile.mkdtemp(prefix="sediment-bench-feeds-probe-", dir=root)
    try:
        with Probe() as probe, sediment.open(data, compact=False) as eng:
            eng.add_relation("r", feeds.SCHEMA)
            eng.seal("r", 0)
            run = feeds.run_in_process_async if mode == "in-process-async" else feeds.run_in_process
            submitted, latency, received = run(eng, subscribers, appends)
    finally:
        shutil.rmtree(data, ignore_errors=True)
    added = probe.added[-appends:]  # the appends' events are the last ones added
    to_callback = [added[i] - submitted[i] for i in range(appends)]
    feed_part = [at - added[i] for out in received for i, at in out]
    delivery = [at - submitted[i] for out in received for i, at in out]
    worst: dict[int, float] = {}
    for out in received:
        for i, at in out:
            worst[i] = max(worst.get(i, 0.0), at - submitted[i])
    cut = feeds.pct(delivery, 99)
    hops = sorted(probe.hand_ons)
    gaps = [b - a for a, b in zip(hops, hops[1:], strict=False)]
    return {"append p50": feeds.pct(latency, 50), "append p99": feeds.pct(latency, 99),
            "to callback p50": feeds.pct(to_callback, 50), "to callback p99": feeds.pct(to_callback, 99),
            "callback to take p50": feeds.pct(feed_part, 50), "callback to take p99": feeds.pct(feed_part, 99),
            "delivery p99": cut, "ratio": cut / feeds.pct(latency, 99),
            "wakes per update": sum(len({at for _, at in out}) for out in received) / max(1, len(delivery)),
            "hand-on gap p50": feeds.pct(gaps, 50), "hand-on gap p99": feeds.pct(gaps, 99),
            "appends held past the p99 (count)": sum(1 for v in worst.values() if v > cut),
            "loop wake-ups per append": probe.resumes / appends,
            "missing": subscribers * appends - len(delivery)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--subscribers", type=int, default=100)
    ap.add_argument("--appends", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--switch-interval", type=float, default=None, help="ms; this process only")
    ap.add_argument("--modes", default="in-process", help="in-process and/or in-process-async, alternated")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    args = ap.parse_args()
    modes = args.modes.split(",")
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval / 1e3)
    feeds.banner(args.subscribers, args.appends, f", switch interval {sys.getswitchinterval() * 1e3:g} ms")
    for r in range(args.rounds):
        for mode in feeds.in_turn(modes, r):
            got = one_round(args.subscribers, args.appends, args.dir, mode)
            shown = ", ".join(f"{k} {v * 1e3:.2f} ms" if k.endswith(("p50", "p99")) else f"{k} {v:.2f}"
                              for k, v in got.items())
            print(f"round {r + 1} {mode} (load {os.getloadavg()[0]:.1f}): {shown}", flush=True)


if __name__ == "__main__":
    main()
