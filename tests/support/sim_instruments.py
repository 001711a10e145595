"""What watches a seeded simulation run (tests/sim_cluster.py): a livelock detector and
the code under test's log lines in the run's trace."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio
import trio.testing

if TYPE_CHECKING:
    from support.sim_cluster import Cluster


class Livelock(trio.abc.Instrument):
    """Flags a run whose tasks keep running while virtual time stands still (a busy retry
    loop: on a real machine it spins a core), and ends it: the MockClock would never move."""

    LIMIT = 20_000

    def __init__(self, cluster: Cluster, clock: trio.testing.MockClock) -> None:
        self.cluster, self.clock = cluster, clock
        self.LIMIT = getattr(cluster, "livelock_limit", self.LIMIT)  # a world of many logs takes more steps
        self.last = -1.0
        self.steps = 0
        self.most = 0  # the most task steps seen at one virtual instant (calibrates LIMIT)
        self.names: dict[str, int] = {}
        self.scope: trio.CancelScope | None = None

    def before_task_step(self, task) -> None:
        now = self.clock.current_time()
        if now != self.last:
            self.most = max(self.most, self.steps)
            self.last, self.steps = now, 0
            return
        self.steps += 1
        if self.steps > self.LIMIT - 2000:
            self.names[task.name] = self.names.get(task.name, 0) + 1
        if self.steps == self.LIMIT and self.scope is not None:
            top = sorted(self.names.items(), key=lambda kv: -kv[1])[:3]
            self.cluster.history.flag("livelock", f"{self.LIMIT} task steps at virtual time {now:.4f} without "
                                      f"time passing; busiest tasks {top}")
            self.scope.cancel()


class TraceLogs(logging.Handler):
    """The code under test's log lines, in the run's trace, at virtual time."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(logging.INFO)
        self.cluster = cluster

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.cluster.note(f"LOG {record.name.rsplit('.', 1)[-1]}: {record.getMessage()}"[:600])
        except RuntimeError:  # outside the trio run
            pass
