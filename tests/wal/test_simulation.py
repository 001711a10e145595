"""The seeded simulation of the whole replicated log (tests/support/sim_cluster.py), and its parts.

Hundreds of seeds run here in small configurations (a few virtual seconds each); the
bench (bench/simulate.py) runs thousands in larger ones. Any failure prints the command
that replays its seed exactly.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import trio
import trio.testing
from support.sim_checker import Final, History, check_final
from support.sim_cluster import FAULT_KINDS, run_seed
from support.sim_world import SimDisk, SimNet, SimPartitionStore

from sediment.wal.control import PartitionState

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = {"steps": 6, "duration": 3.0, "clients": 2}
# Faults every correct store session survives on its own: node crashes losing unsynced
# writes, partitions of every shape, delays and reordering, resets, full and slow disks.
NODE_FAULTS = {k: FAULT_KINDS[k] for k in ("node_crash", "partition", "partition_oneway", "partition_coordinator",
                                           "slow_link", "conn_reset", "disk_full", "slow_disk")}


def replay(seed: int, steps: int, duration: float, kinds: dict | None, clients: int) -> str:
    extra = f" --kinds {','.join(kinds)}" if kinds else ""
    return (f"python bench/simulate.py --seed {seed} --steps {steps} --duration {duration} --clients {clients}"
            f"{extra} --trace")


def _check(seeds: range, **kw) -> None:
    failing = []
    for seed in seeds:
        r = run_seed(seed, steps=kw.get("steps", SMALL["steps"]), duration=kw.get("duration", SMALL["duration"]),
                     kinds=kw.get("kinds"), clients=kw.get("clients", SMALL["clients"]))
        assert r.acked > 0, f"seed {seed}: nothing was acknowledged, so nothing was checked"
        if r.counts:
            failing.append(f"seed {seed}: {r.counts}: {r.violations[0].kind}: {r.violations[0].detail[:300]}\n"
                           f"    replay: {replay(seed, kw.get('steps', 6), kw.get('duration', 3.0), kw.get('kinds'), kw.get('clients', 2))}")
    assert not failing, "\n".join(failing)


@pytest.mark.parametrize("chunk", range(3))
def test_node_and_network_faults_break_no_rule(chunk: int) -> None:
    """Crashes losing unsynced writes, partitions, reordering, resets, full disks: 120 seeds."""
    _check(range(10_000 + 40 * chunk, 10_000 + 40 * (chunk + 1)), kinds=NODE_FAULTS)


@pytest.mark.parametrize("chunk", range(4))
def test_every_fault_kind_breaks_no_rule(chunk: int) -> None:
    """The whole schedule, coordinator and metadata faults included: 160 seeds."""
    _check(range(40 * chunk, 40 * (chunk + 1)))


@pytest.mark.parametrize("seed", [75, 79])
def test_carried_over_appends_are_acknowledged_only_where_the_log_holds_them(seed: int) -> None:
    """Regression (issue 13): a coordinator whose session closed with appends in flight,
    while another coordinator's sessions ran and wrote their own records at those LSNs,
    acknowledged its appends there because they were below the new closing high-water
    mark: one LSN acknowledged for two records (conflicting_ack, lost_ack, order)."""
    r = run_seed(seed, steps=12, duration=8.0)
    assert r.acked > 0 and ("coord_takeover" in r.faults or "coord_crash" in r.faults)
    assert r.counts == {}, f"{r.violations}\n    replay: {replay(seed, 12, 8.0, None, 3)}"


@pytest.mark.parametrize("seed", [1453, 1475, 1887])
def test_storage_newer_than_its_metadata_state_keeps_its_low_water_mark(seed: int) -> None:
    """Regression: a session resolved a mark and set it as the nodes' low-water mark, then
    failed to write the metadata (an outage, a crash). The next recovery truncated a node
    to its stale metadata closing mark, resolved below the nodes' low-water marks and
    could never set them: the final recovery hung (see also tests/wal/test_replication_recovery_sim.py). In
    1453 the session failed before setting its mark: the stale closing mark still holds
    (truncating to the older low-water mark cut acknowledged records)."""
    r = run_seed(seed, steps=12, duration=8.0)
    assert r.acked > 0
    assert r.counts == {}, f"{r.violations}\n    replay: {replay(seed, 12, 8.0, None, 3)}"


def test_the_vote_never_resolves_below_a_stored_low_water_mark() -> None:
    """Regression (seed 4541): a session resolved 273 and set it as two nodes' low-water
    mark, then crashed before the metadata update; the third replica it had caught up was
    truncated back to its stale closing mark. The final recovery resolved 272 (a quorum
    with a node that lost 273 in a crash), below the marks the nodes never lower: it hung
    (see also tests/wal/test_replication_recovery_sim.py and tests/wal/test_vote.py)."""
    r = run_seed(4541, steps=12, duration=8.0)
    assert r.acked > 0 and "node_crash" in r.faults
    assert r.counts == {}, f"{r.violations}\n    replay: {replay(4541, 12, 8.0, None, 3)}"


def test_same_seed_same_schedule_same_result() -> None:
    a = run_seed(7, **SMALL)
    b = run_seed(7, **SMALL)
    c = run_seed(8, **SMALL)
    assert a.trace == b.trace and a.digest == b.digest and a.counts == b.counts and a.faults == b.faults
    assert a.acked > 0 and a.digest != c.digest


def test_a_seed_replays_beside_another_trio_run() -> None:
    """Regression (seed 7 differed at 4.0629 vs 4.0630 s in a loaded full suite): trio's
    scheduler generator is process-global, and a trio run left in another thread (a storage
    node, a replicated log) drew from the one the simulation had seeded, at the pace of
    real time. With a run beside it busy drawing, the seed still replays exactly."""
    alone = run_seed(7, **SMALL)
    started, stop = threading.Event(), threading.Event()
    ticks = [0]

    async def busy() -> None:
        async def tick() -> None:
            while not stop.is_set():
                ticks[0] += 1
                await trio.sleep(0)  # always runnable: it wants the GIL whenever the simulation holds it

        started.set()
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(tick)

    beside = threading.Thread(target=trio.run, args=(busy,), daemon=True)
    beside.start()
    try:
        assert started.wait(10)
        runs, before = [], ticks[0]
        for _ in range(3):
            runs.append(run_seed(7, **SMALL))
        assert ticks[0] > before, "the other trio run made no step during the simulations: nothing was tested"
    finally:
        stop.set()
        beside.join(10)
    for r in runs:
        first = next((f"line {i}: {a!r} != {b!r}" for i, (a, b) in enumerate(zip(alone.trace, r.trace, strict=False))
                      if a != b),
                     f"{len(alone.trace)} != {len(r.trace)} lines")
        assert r.trace == alone.trace and r.digest == alone.digest, first


def test_a_seed_reads_no_real_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every clock and timer of the simulated components is the run's virtual one: real
    clocks that jump at random (as on a loaded machine, seconds between two reads) leave the
    trace as it was. The read count shows the patched clocks were in place."""
    alone = run_seed(7, **SMALL)
    import random
    import time

    jumps = random.Random(99)
    reads = [0]

    def erratic(real):
        def read() -> float:
            reads[0] += 1
            return real() + jumps.uniform(0, 30) * reads[0]
        return read

    for name in ("monotonic", "perf_counter", "time", "thread_time"):
        monkeypatch.setattr(time, name, erratic(getattr(time, name)))
    jumped = run_seed(7, **SMALL, logs=True)
    monkeypatch.undo()
    assert reads[0] > 0
    assert [line for line in jumped.trace if " LOG " not in line] == alone.trace


def test_a_seed_replays_in_another_process() -> None:
    """The bench replays a seed from its number alone, whatever the hash seed of the process."""
    here = run_seed(3, steps=6, duration=3.0, logs=True)
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "simulate.py"), "--seed", "3", "--steps", "6",
                          "--duration", "3.0", "--trace"], capture_output=True, text=True, env=env, timeout=120,
                         cwd="/")
    assert f"digest {here.digest[:16]}" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
    assert "runs: 1 seeds (3..3)" in out.stdout


def test_every_fault_kind_is_injected() -> None:
    seen: dict[str, int] = {}
    seed = 0
    while set(seen) != set(FAULT_KINDS) and seed < 60:
        for k, n in run_seed(seed, steps=12, duration=3.0, clients=1).faults.items():
            seen[k] = seen.get(k, 0) + n
        seed += 1
    assert set(seen) == set(FAULT_KINDS), f"never injected: {set(FAULT_KINDS) - set(seen)}"


def test_no_faults_no_violations_and_every_append_acknowledged() -> None:
    r = run_seed(1, steps=0, duration=2.0, clients=3)
    assert r.counts == {} and r.faults == {}
    assert r.acked == r.appends > 50


# --- the simulated world ------------------------------------------------------------------


def run_trio(fn) -> None:
    trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0))


def test_disk_crash_keeps_exactly_the_synced_operations() -> None:
    async def main() -> None:
        import random
        disk = SimDisk("d", random.Random(1))
        store = SimPartitionStore(disk)
        disk.write([b"a", b"b"])
        await trio.sleep_until(disk.horizon)
        store.write_state(PartitionState(3, 1, 1))
        disk.truncate(1)
        disk.write([b"c"])
        synced = disk.horizon
        await trio.sleep_until(synced)
        disk.write([b"d"])
        disk.truncate(0)
        assert disk.frames == [] and disk.horizon > synced
        disk.crash()
        assert disk.frames == [b"a", b"c"] and disk.state.session_id == 3 and disk.lost_ops == 2
        disk.capacity = disk.used
        with pytest.raises(OSError, match="no space"):
            store.write(b"x", 2, [1])
        assert disk.frames == [b"a", b"c"]

    run_trio(main)


def test_network_keeps_order_per_connection_and_holds_bytes_while_blocked() -> None:
    async def main() -> None:
        import random
        net = SimNet(random.Random(2))
        got: list[bytes] = []

        class Ep:
            up = True
            disk = SimDisk("n", random.Random(3))
            conns: list = []
            nursery = None

            def accept(self, conn) -> None:
                self.conns.append(conn)
                self.nursery.start_soon(self.serve, conn.server)

            async def serve(self, stream) -> None:
                while data := await stream.receive_some():
                    got.append(data)

        async with trio.open_nursery() as nursery:
            ep = Ep()
            ep.nursery = nursery
            net.nodes["n"] = ep
            net.slow["n"] = 0.5
            client = await net.connect("c", "n")
            for i in range(20):
                await client.send_all(b"%d," % i)
            await trio.sleep(1)  # delivered, in order, despite random per-message delays
            net.block("c", "n")
            await client.send_all(b"held")
            await trio.sleep(5)
            assert b"held" not in got and got == [b"%d," % i for i in range(20)]
            net.unblock("c", "n")
            await trio.sleep(1)
            assert got[-1] == b"held"
            ep.up = False
            with pytest.raises(OSError):
                await net.connect("c", "n")
            nursery.cancel_scope.cancel()

    run_trio(main)


# --- the checker: precise, no false positives ---------------------------------------------


def _final(logs: dict[str, list[bytes]], committed: int, session: int = 2) -> Final:
    reps = sorted(logs)
    return Final(reps, reps, committed, session, logs, session, {a: (session, -2) for a in reps},
                 {a: session for a in reps}, -2)


def test_checker_allows_outcome_unknown_appends_either_way() -> None:
    from sediment.errors import QuorumLost, SessionFenced

    h = History()
    ok = h.submitted([b"a"], "c1", 0.0)
    h.answered(ok, 0, None, 1)
    lost = h.submitted([b"b"], "c1", 0.1)
    h.answered(lost, -1, QuorumLost("x"), 1)
    kept = h.submitted([b"c"], "c1", 0.2)
    h.answered(kept, -1, SessionFenced("x"), 1)
    h.submitted([b"d"], "c1", 0.3)  # its coordinator crashed: never answered
    check_final(h, _final({"x": [b"a", b"c", b"d"], "y": [b"a", b"c", b"d"], "z": [b"a"]}, 2), None)
    assert h.counts == {}


def test_checker_flags_each_broken_rule() -> None:
    h = History()
    a = h.submitted([b"a"], "c1", 0.0)
    h.answered(a, 0, None, 1)
    b = h.submitted([b"b", b"b2"], "c1", 0.1)
    h.answered(b, 2, None, 1)
    c = h.submitted([b"c"], "c1", 0.2)  # acknowledged at an LSN below one acknowledged before it was sent
    h.answered(c, 1, None, 3)
    h.answered(c, 1, None, 3)
    h.meta_written(5, 0, "c1")
    h.meta_written(4, 0, "c2")
    h.node_state("n", PartitionState(5, 7, 7), PartitionState(5, 6, 6))
    # replica z lost b2, x and y disagree at LSN 3, and x holds "b" twice and a stranger
    logs = {"x": [b"a", b"b", b"b2", b"b", b"zz"], "y": [b"a", b"b", b"b2", b"q", b"zz"], "z": [b"a", b"c"]}
    check_final(h, _final(logs, 4), None)
    assert set(h.counts) == {"double_callback", "meta_regression", "lwm_regression", "hwm_regression", "order",
                             "conflicting_ack", "lost_ack", "divergence", "duplicate", "phantom"}, h.counts
