"""Prometheus metrics of one engine, and the HTTP endpoint that serves them.

Two kinds of figures, kept apart on purpose:

- events (appends, rows, latencies, merges, blob requests, errors) are counted where they
  happen, into instruments owned by :class:`EngineMetrics`;
- state (WAL backlog, per-relation frontiers and lag, batches, subscribers) is not counted
  at all: it is read from :meth:`Engine.stats` when Prometheus scrapes, so a gauge can
  never drift from what the engine holds.

Each engine has its own ``CollectorRegistry``: two engines in one process (tests, a
server and a tool) never share or double-register a metric.
"""

from __future__ import annotations

import bisect
import contextlib
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import generate_latest, start_http_server
from prometheus_client.utils import floatToGoString

disable_created_metrics()  # `*_created` series double every counter and say nothing an operator needs

PREFIX = "sediment"
_bisect_left = bisect.bisect_left  # bound once: histograms observe for every append
_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                    2.5, 5.0, 10.0)
_COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


def _counter(registry: CollectorRegistry, name: str, doc: str, *labels: str) -> Counter:
    return Counter(f"{PREFIX}_{name}", doc, list(labels), registry=registry)


def _histogram(registry: CollectorRegistry, name: str, doc: str, buckets: tuple = _LATENCY_BUCKETS) -> Histogram:
    return Histogram(f"{PREFIX}_{name}", doc, buckets=buckets, registry=registry)


class EngineMetrics:
    """The event instruments of one engine (see the module doc for why state is not here)."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        # The four figures every append moves are plain numbers read at scrape (see PlainCounter)
        self.appends = PlainCounter(r, "appends", "Durable appends per relation: each append, each relation an "
                                    "append_many wrote, each relation a committed transaction wrote (in process, "
                                    "served, or from Spark and ingest)", "relation")
        self.rows = PlainCounter(r, "rows_appended", "Update rows made durable and visible by appends and "
                                 "transaction commits", "relation")
        self.append_latency = ThreadHistogram(r, "append_latency_seconds", "From the call to the durable "
                                              "acknowledgement")
        self.group_commit = ThreadHistogram(r, "group_commit_records", "WAL records made durable together by one "
                                            "group commit (one sync of the log)", _COUNT_BUCKETS)
        self.seals = _counter(r, "seals", "Acknowledged seal calls", "relation")
        self.compactions = _counter(r, "compaction_passes", "Compaction passes run")
        self.compaction_seconds = _histogram(r, "compaction_pass_seconds", "Duration of a compaction pass")
        self.batches_written = _counter(r, "batches_written", "Batches written from the WAL", "relation")
        self.merges = _counter(r, "merges", "Batch merges committed", "relation")
        self.major_compactions = _counter(r, "major_compactions", "Background major compactions committed (a quiet "
                                          "relation's batches merged into one)", "relation")
        self.merge_seconds = _histogram(r, "merge_seconds", "Duration of one merge")
        self.blob_requests = _counter(r, "blob_requests", "Blob store requests", "op")
        self.errors = _counter(r, "errors", "Errors by kind (typed error class) and where they happened", "where",
                               "kind")
        self.quorum_latency = _histogram(r, "quorum_latency_seconds", "Replicated log: from a submit to a write "
                                         "quorum's durable acknowledgement")
        self.backlog_waits = _counter(r, "wal_backlog_waits", "Appends that waited because the WAL backlog was at "
                                      "max_wal_backlog")
        self.retries = _counter(r, "retries", "Work retried after an error (e.g. a relation's compaction)", "where")

    def relation_counters(self, relation: str) -> RelationCounters:
        """The counters of a relation that now exists, each exported at 0 from this moment:
        a dashboard sees a new relation before its first append, not only after it."""
        self.seals.labels(relation=relation)
        return RelationCounters(self.appends.labels(relation=relation), self.rows.labels(relation=relation))

    def forget_relation(self, relation: str) -> None:
        """Stop exporting a dropped relation's series (a relation added again starts at 0)."""
        for counter in (self.appends, self.rows, self.seals, self.batches_written, self.merges,
                        self.major_compactions):
            with contextlib.suppress(KeyError):
                counter.remove(relation)

    @contextmanager
    def timed(self, histogram: Histogram) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            histogram.observe(time.perf_counter() - start)

    def error(self, where: str, exc: BaseException) -> None:
        self.errors.labels(where=where, kind=type(exc).__name__).inc()

    def watch_state(self, stats: Callable[[], dict[str, Any]]) -> None:
        """Serve the engine's state (``stats()``) as gauges, read at each scrape."""
        self.registry.register(_StateCollector(stats))

    def exposition(self) -> bytes:
        """The Prometheus text exposition of every metric (what ``/metrics`` serves)."""
        return generate_latest(self.registry)


class _Count:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def inc(self, amount: float = 1) -> None:
        self.value += amount


class PlainCounter:
    """A counter with one label whose series are plain numbers, exported at scrape time.

    Why: a ``prometheus_client`` ``inc`` takes a lock and runs about a microsecond of
    Python, and every durable append bumped two of them. Callers bump a series under a lock
    of their own (the engine lock, for the relation counters), which makes ``+=`` safe."""

    def __init__(self, registry: CollectorRegistry, name: str, doc: str, label: str) -> None:
        self.name = f"{PREFIX}_{name}"
        self.doc = doc
        self.label = label
        self._series: dict[str, _Count] = {}
        registry.register(self)

    def labels(self, **labels: str) -> _Count:
        """The series of one label value (created at 0)."""
        value = str(labels[self.label])
        series = self._series.get(value)
        if series is None:
            series = self._series.setdefault(value, _Count())
        return series

    def remove(self, value: str) -> None:
        """Stop exporting one series; KeyError if there is none."""
        del self._series[value]

    def describe(self) -> list:
        return []

    def collect(self) -> list[CounterMetricFamily]:
        family = CounterMetricFamily(self.name, self.doc, labels=[self.label])
        for value, series in list(self._series.items()):
            family.add_metric([value], series.value)
        return [family]


class _Owner:
    """Lives as long as its thread's ``threading.local`` slot: a dead weak reference to it
    means the thread is gone and its cell will not change again."""

    __slots__ = ("__weakref__",)


class ThreadHistogram:
    """A histogram each thread observes into its own cell (bucket counts, then the sum),
    without a lock; a scrape adds the cells up, and folds those of finished threads into
    one total.

    Why: ``prometheus_client``'s ``observe`` takes two locks and runs about 2.5 us of Python,
    and every append observed two histograms; 64 writer threads would also contend on them.
    Only a cell's own thread writes it, so nothing is lost; a scrape may read a cell midway
    through an observation and show it at the next scrape."""

    def __init__(self, registry: CollectorRegistry, name: str, doc: str,
                 buckets: tuple = _LATENCY_BUCKETS) -> None:
        self.name = f"{PREFIX}_{name}"
        self.doc = doc
        self._bounds = tuple(float(b) for b in buckets)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._cells: list[tuple[weakref.ref, list[float]]] = []
        self._retired = [0.0] * (len(self._bounds) + 2)
        self._fold_at = 64
        self._also: list[tuple[float, Callable[[], int]]] = []
        registry.register(self)

    def count_also(self, value: float, count: Callable[[], int]) -> None:
        """At each scrape, add ``count()`` observations of ``value``: for a hot path that
        counts its (always equal) observations in a plain number of its own, under a lock it
        holds anyway, rather than calling :meth:`observe` each time."""
        self._also.append((value, count))

    def observe(self, value: float) -> None:
        try:
            cell = self._local.cell
        except AttributeError:
            cell = self._new_cell()
        cell[_bisect_left(self._bounds, value)] += 1
        cell[-1] += value

    def _new_cell(self) -> list[float]:
        cell = [0.0] * (len(self._bounds) + 2)  # one count per bound, +Inf, then the sum
        owner = _Owner()
        self._local.owner = owner
        self._local.cell = cell
        with self._lock:
            self._cells.append((weakref.ref(owner), cell))
            if len(self._cells) >= self._fold_at:  # threads come and go unscraped: keep the list near the live ones
                self._fold()
                self._fold_at = max(64, 2 * len(self._cells))
        return cell

    def _fold(self) -> None:
        """Under the lock: add finished threads' cells to the retired total and drop them."""
        live = []
        for ref, cell in self._cells:
            if ref() is None:
                self._retired = [a + b for a, b in zip(self._retired, cell, strict=True)]
            else:
                live.append((ref, cell))
        self._cells = live

    @property
    def cells(self) -> int:
        """How many per-thread cells are held (live threads', and finished ones' not yet folded)."""
        return len(self._cells)

    def _totals(self) -> list[float]:
        with self._lock:
            self._fold()
            live = self._cells
            total = list(self._retired)
            for _ref, cell in live:
                total = [a + b for a, b in zip(total, cell, strict=True)]
        for value, count in self._also:
            n = count()
            total[_bisect_left(self._bounds, value)] += n
            total[-1] += value * n
        return total

    def describe(self) -> list:
        return []

    def collect(self) -> list[HistogramMetricFamily]:
        total = self._totals()
        buckets, seen = [], 0.0
        for bound, count in zip((*self._bounds, float("inf")), total, strict=False):
            seen += count
            buckets.append((floatToGoString(bound), seen))
        return [HistogramMetricFamily(self.name, self.doc, buckets=buckets, sum_value=total[-1])]


class RelationCounters:
    """One relation's append counters, bound once (``labels()`` costs microseconds; these are
    bumped under the engine lock for every durable append or commit)."""

    __slots__ = ("appends", "rows")

    def __init__(self, appends: Any, rows: Any) -> None:
        self.appends = appends
        self.rows = rows

    def add(self, rows: int, appends: int = 1) -> None:
        self.appends.value += appends  # _Count.inc without its call: this runs for every durable append
        self.rows.value += rows


class _StateCollector:
    """Gauges read from ``Engine.stats()`` at scrape time."""

    def __init__(self, stats: Callable[[], dict[str, Any]]) -> None:
        self._stats = stats

    def describe(self) -> list:
        return []  # computed at scrape time; nothing to check at registration

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            s = self._stats()
        except Exception:  # noqa: BLE001 - a closed engine has no state to show; the scrape still answers
            return
        wal = s["wal"]
        for key in ("start_lsn", "end_lsn", "backlog_bytes", "backlog_records", "backlog_bound_bytes", "segments",
                    "bytes", "recycled_files"):
            if wal.get(key) is not None:
                yield GaugeMetricFamily(f"{PREFIX}_wal_{key}", f"WAL {key.replace('_', ' ')}", value=wal[key])
        lag = GaugeMetricFamily(f"{PREFIX}_replica_lag_records", "Replicated log: acknowledged records a "
                                "replica has yet to confirm", labels=["replica", "state"])
        for address, replica in (s.get("replicas") or {}).items():
            lag.add_metric([address, str(replica["state"])], replica["lag"])
        yield lag
        per_rel = {
            "rows": "Rows stored in the relation's batches",
            "batches": "Batches in the relation's trace",
            "stored_bytes": "Bytes of the relation's batches in the blob store",
            "since": "Compaction frontier",
            "sealed": "Sealed (durable) frontier",
            "trace_upper": "Upper of the relation's trace (times below it are in batches)",
            "tail_records": "WAL records of the relation not yet compacted",
            "tail_bytes": "Bytes of WAL records of the relation not yet compacted",
            "compaction_lag": "Sealed frontier minus trace upper, plus one: sealed times not yet in batches",
            "seconds_since_last_batch": "Seconds since the relation's trace last changed in this process",
            "subscribers": "Open feed subscriptions",
            "subscriber_lag": "Feed events the slowest subscriber has yet to read",
        }
        for key, doc in per_rel.items():
            family = GaugeMetricFamily(f"{PREFIX}_relation_{key}", doc, labels=["relation"])
            for name, rel in s["relations"].items():
                if rel.get(key) is not None:
                    family.add_metric([name], rel[key])
            yield family


class NodeMetrics:
    """A storage node's instruments: what its partitions' writer threads wrote and synced,
    and (read at scrape time) each partition's next LSN, session and low-water mark."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.records = _counter(r, "node_records_appended", "Records a partition made durable", "partition")
        self.bytes = _counter(r, "node_bytes_appended", "Bytes a partition made durable", "partition")
        self.syncs = _counter(r, "node_syncs", "Group commits (one sync each)", "partition")
        self.sync_seconds = _histogram(r, "node_sync_seconds", "Write plus sync of one group of appends")
        self.errors = _counter(r, "node_errors", "Operations that failed in a partition's store", "partition")

    def count_sync(self, partition: int, records: int, size: int, seconds: float) -> None:
        label = str(partition)
        self.records.labels(partition=label).inc(records)
        self.bytes.labels(partition=label).inc(size)
        self.syncs.labels(partition=label).inc()
        self.sync_seconds.observe(seconds)

    def watch_partitions(self, partitions: Callable[[], dict[int, Any]]) -> None:
        """Gauges of each partition, read at scrape time from the node's own state."""
        self.registry.register(_PartitionCollector(partitions))


class _PartitionCollector:
    def __init__(self, partitions: Callable[[], dict[int, Any]]) -> None:
        self._partitions = partitions

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        parts = dict(self._partitions())
        fields = {"next_lsn": ("next LSN the partition will store (its high-water mark + 1)", lambda p: p.next_lsn),
                  "session": ("store session of the partition's last recorded state", lambda p: p.state.session_id),
                  "low_water_mark": ("low-water mark of the partition's last recorded state",
                                     lambda p: p.state.low_water_mark)}
        for name, (doc, get) in fields.items():
            family = GaugeMetricFamily(f"{PREFIX}_node_partition_{name}", doc, labels=["partition"])
            for pid, part in sorted(parts.items()):
                family.add_metric([str(pid)], get(part))
            yield family


class MetricsServer:
    """``/metrics`` over HTTP on a loopback (or given) address, in daemon threads."""

    def __init__(self, metrics: EngineMetrics | NodeMetrics, host: str, port: int) -> None:
        self._server, self._thread = start_http_server(port, addr=host, registry=metrics.registry)
        self.host = host
        self.port = self._server.server_address[1]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
