"""Feed latency: from a durable append to its delivery on live subscribers.

    .venv/bin/python bench/feeds.py            # 1, 10 and 100 subscribers, ~30 s
    .venv/bin/python bench/feeds.py --quick

One writer appends single-row updates and waits for durability; N subscriber threads
read the feed. For every update the script records the append's own latency (submit
to acknowledged) and each subscriber's delivery latency (submit to received: a
subscriber can receive an update before the writer's append call has returned, since
the feed is fed by the durability callback). Target: p99 delivery under 2x the
append's own p99.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import threading
import time

import pyarrow as pa

import sediment

SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.binary())])


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))] if values else float("nan")


def run(subscribers: int, appends: int) -> dict:
    data = tempfile.mkdtemp(prefix="sediment-bench-feeds-")
    try:
        with sediment.open(data, compact=False) as eng:
            eng.add_relation("r", SCHEMA)
            eng.seal("r", 0)
            submitted_at: dict[int, float] = {}
            append_lat: list[float] = []
            delivery: list[float] = []
            lock = threading.Lock()
            subs = [eng.subscribe("r") for _ in range(subscribers)]
            for s in subs:
                s.next(timeout=5)  # the snapshot

            received: list[list[tuple[int, float]]] = []

            def reader(sub) -> None:
                mine: list[tuple[int, float]] = []  # (id, receive time): no shared state while reading
                received.append(mine)
                got = 0
                while got < appends:
                    event = sub.next(timeout=10)
                    if event is None:
                        return
                    now = time.perf_counter()
                    if event.kind != "updates":
                        continue
                    ids = event.table.column("id").to_pylist()
                    got += len(ids)
                    mine.extend((i, now) for i in ids)

            threads = [threading.Thread(target=reader, args=(s,)) for s in subs]
            for th in threads:
                th.start()
            for i in range(appends):
                table = pa.table({"id": [i], "payload": [b"x" * 76], "time": [i + 1], "diff": [1]},
                                 schema=SCHEMA.append(pa.field("time", pa.int64())).append(pa.field("diff", pa.int64())))
                start = time.perf_counter()
                with lock:
                    submitted_at[i] = start
                eng.append("r", table)
                append_lat.append(time.perf_counter() - start)
            for th in threads:
                th.join()
            for s in subs:
                s.close()
            delivery.extend(now - submitted_at[i] for mine in received for i, now in mine)
        return {"subscribers": subscribers, "appends": appends,
                "append_p50": pct(append_lat, 50), "append_p99": pct(append_lat, 99),
                "delivery_p50": pct(delivery, 50), "delivery_p99": pct(delivery, 99),
                "delivered": len(delivery), "mean_delivery": statistics.fmean(delivery) if delivery else float("nan")}
    finally:
        shutil.rmtree(data, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    appends = 300 if args.quick else 1500
    rows = [run(n, appends) for n in (1, 10, 100)]
    print(f"{'subscribers':>11} | {'append p50':>10} {'append p99':>10} | {'delivery p50':>12} {'delivery p99':>12} |"
          f" {'p99 ratio':>9} | target")
    for r in rows:
        ratio = r["delivery_p99"] / r["append_p99"]
        print(f"{r['subscribers']:>11} | {r['append_p50'] * 1e3:>8.2f}ms {r['append_p99'] * 1e3:>8.2f}ms | "
              f"{r['delivery_p50'] * 1e3:>10.2f}ms {r['delivery_p99'] * 1e3:>10.2f}ms | {ratio:>8.2f}x | "
              f"{'met' if ratio < 2 else 'MISSED'} (< 2x)  [{r['delivered']} deliveries]")


if __name__ == "__main__":
    main()
