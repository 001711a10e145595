"""Prometheus instruments of one cluster member (``sediment serve --cluster --metrics-listen``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from sediment.metrics import PREFIX


class ClusterMetrics:
    """Ownership and client-protocol events of one member, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.partitions_owned = Gauge(f"{PREFIX}_cluster_partitions_owned", "Partitions this member serves now",
                                      registry=r)
        self.ownership_changes = Counter(f"{PREFIX}_cluster_ownership_changes", "Partitions this member took "
                                         "or gave up", ["direction"], registry=r)
        self.failovers = Counter(f"{PREFIX}_cluster_failovers", "Partitions taken over from a member whose "
                                 "session had ended (not handed over)", registry=r)
        self.redirects = Counter(f"{PREFIX}_cluster_redirects_served", "Calls answered with a redirect to "
                                 "the partition's owner", registry=r)
        self.read_confirmations = Counter(f"{PREFIX}_cluster_read_confirmations", "Reads of the assignment "
                                          "that confirmed ownership for the reads waiting then", registry=r)
        self.deduplicated = Counter(f"{PREFIX}_cluster_appends_deduplicated", "Retried appends found already "
                                    "applied (answered success, not applied again)", registry=r)
