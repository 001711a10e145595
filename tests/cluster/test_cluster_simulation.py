"""The seeded simulation's cluster mode (tests/support/sim_members.py): members, a manager, moves.

A few dozen seeds run here (``bench/simulate.py --cluster`` runs hundreds); then the same
world with the members' ZooKeeper lease switched off, so that only the fences where the
data lands (partition metadata generation, storage-node session) stop a stale owner; then
two deliberately wrong managers, to show the cluster checks catch what they are for.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter

import pytest
from support import sim_members
from support.sim_members import ClusterSim, run_cluster_seed

from sediment.cluster.assignment import PartitionOwner, plan_assignment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(seeds: range) -> tuple[list[str], Counter]:
    failing, totals = [], Counter()
    for seed in seeds:
        r = run_cluster_seed(seed)
        assert r.acked > 0, f"seed {seed}: nothing was acknowledged, so nothing was checked"
        totals.update(r.sim.stats)
        totals.update(r.faults)
        if r.counts:
            failing.append(f"seed {seed}: {r.counts}: {r.violations[0].kind}: {r.violations[0].detail[:300]}\n"
                           f"    replay: python bench/simulate.py --cluster --seed {seed} --trace")
    return failing, totals


@pytest.mark.parametrize("chunk", range(3))
def test_cluster_seeds_break_no_rule(chunk: int) -> None:
    """36 seeds: members killed, paused past their session, joining and leaving, the manager
    killed, ZooKeeper unreachable, storage nodes crashing. Every partition's history checks,
    one owner per partition and generation, every partition served again within the bound. With
    the lease (as deployed) a member resumed after its session ended writes nothing at all."""
    failing, totals = _run(range(12 * chunk, 12 * (chunk + 1)))
    assert not failing, "\n".join(failing)
    assert totals["moves"] > 0 and totals["sessions_expired"] > 0 and totals["member_pause"] > 0, totals
    assert totals["stale_owner_acks"] == 0 and totals["stale_owner_appends"] == 0, totals


def test_fences_where_the_data_lands_hold_without_the_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    """A member resumed after its session ended still believes it owns its partitions; with
    the lease off it submits appends to them. The newer owner's generation (metadata) and
    session (storage nodes) refuse them: no acknowledged append is lost or doubled."""
    monkeypatch.setattr(ClusterSim, "lease", False)
    failing, totals = _run(range(24))
    assert not failing, "\n".join(failing)
    assert totals["stale_owner_appends"] > 0, f"no stale owner ever wrote, so the fence was not exercised: {totals}"
    assert totals["stale_owner_SessionFenced"] > 0, totals


def test_a_manager_that_reuses_generations_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A planner that moves a partition without bumping its generation lets two members
    acknowledge under one generation: the ``two_owners`` check flags it."""
    def same_generation(partitions, live, current, leaving=()):
        plan = plan_assignment(partitions, live, current, leaving)
        return {p: PartitionOwner(o.member, current[p].generation) if current.get(p) else o for p, o in plan.items()}

    monkeypatch.setattr(sim_members, "plan_assignment", same_generation)
    caught = [s for s in range(6) if "two_owners" in run_cluster_seed(s).counts]
    assert caught, "no seed caught two owners acknowledging under one generation"


def test_a_manager_that_keeps_dead_members_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A planner that still counts members whose session ended leaves their partitions unserved:
    the ``unowned`` check flags it."""
    ever: set[str] = set()

    def remembers(partitions, live, current, leaving=()):
        ever.update(live)
        return plan_assignment(partitions, sorted(ever), current, leaving)

    monkeypatch.setattr(sim_members, "plan_assignment", remembers)
    caught = []
    for seed in range(4):
        ever.clear()
        if "unowned" in run_cluster_seed(seed).counts:
            caught.append(seed)
    assert caught, "no seed caught a partition left on a dead member"


def test_same_seed_same_run() -> None:
    a, b = run_cluster_seed(7), run_cluster_seed(7)
    assert a.digest == b.digest and a.acked == b.acked and a.faults == b.faults


def test_plan_at_a_thousand_partitions_and_fifty_members_is_quick() -> None:
    """The manager's plan at the scale of docs/scale.md: balanced, and far under a second."""
    members = [f"m{i}" for i in range(50)]
    started = time.perf_counter()
    first = plan_assignment(1000, members, {})
    after_death = plan_assignment(1000, members[1:], first)
    after_join = plan_assignment(1000, [*members[1:], "new"], after_death)
    took = time.perf_counter() - started
    assert took < 0.5, f"three plans of 1,000 partitions took {took:.3f}s"
    for plan, n in ((first, 50), (after_death, 49), (after_join, 50)):
        sizes = Counter(o.member for o in plan.values())
        assert len(sizes) == n and max(sizes.values()) - min(sizes.values()) <= 1
    assert sum(1 for p in first if first[p].member != after_death[p].member) == 20  # only the dead member's


def test_bench_cluster_flag_runs_the_cluster_mode() -> None:
    out = subprocess.run([sys.executable, "bench/simulate.py", "--cluster", "--seeds", "2", "--partitions", "3"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "cluster: 3 partitions" in out.stdout and "violations: 0" in out.stdout
    assert "plan_assignment, CPU:" in out.stdout
    helped = subprocess.run([sys.executable, "bench/simulate.py", "--help"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert "--cluster" in helped.stdout and "--partitions" in helped.stdout
