"""Unsealed updates kept as sorted pending runs: a pass reads only what became sealed.

Before, every pass read every pending batch back and consolidated all of it again, so a
stream whose times stayed unsealed cost quadratic time. These tests pin the linear
behaviour (a pass over unsealed data reads no blob), the run limit, the split of a run
across the new upper, results against a brute-force model, and SIGKILL at any point.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import textwrap

import pyarrow as pa
import pytest

from sediment.clock import ManualClock

SCHEMA = pa.schema([("k", pa.int64())])


def ups(k, t, d=None):
    return pa.table({"k": pa.array(k, pa.int64()), "time": pa.array(t, pa.int64()),
                     "diff": pa.array(d or [1] * len(k), pa.int64())})


def gets(eng):
    return eng.metrics.blob_requests.labels(op="get")._value.get()


def as_model(table):
    out = {}
    for r in table.to_pylist():
        out[r["k"]] = out.get(r["k"], 0) + r["diff"]
    return {k: d for k, d in out.items() if d}


@pytest.fixture
def eng(open_engine):
    e = open_engine(clock=ManualClock(), segment_bytes=64 << 20)  # compacter on, idle: passes run on compact()
    e.add_relation("r", SCHEMA)
    return e


@pytest.mark.embedded_only  # eng.view.relations, eng.metrics
def test_a_pass_over_unsealed_data_reads_no_earlier_run(eng):
    """Six steps of unsealed updates: each pass adds one run and reads none back; sealing
    then folds every run into one batch, reading each run once."""
    for step in range(6):
        eng.append("r", ups(list(range(step * 100, step * 100 + 50)), [10 + step] * 50))
        before = gets(eng)
        eng.compact()
        assert gets(eng) == before, f"pass {step} read earlier pending runs back"
        assert len(eng.view.relations["r"].trace.pending) == step + 1
    eng.seal("r", 20)
    before = gets(eng)
    eng.compact()
    trace = eng.view.relations["r"].trace
    assert not trace.pending and trace.upper == 21
    assert gets(eng) - before == 6, "each run whose times became sealed is read once"
    assert as_model(eng.snapshot("r", 20)) == {k: 1 for s in range(6) for k in range(s * 100, s * 100 + 50)}


@pytest.mark.embedded_only
def test_runs_past_the_limit_are_merged_and_reads_stay_right(eng):
    eng.settings.max_pending_runs = 3
    expect = {}
    for step in range(10):
        ks = [step % 4 * 10 + i for i in range(8)]
        eng.append("r", ups(ks, [100 + step] * 8, [1 if step % 3 else -1] * 8))
        for k in ks:
            expect[k] = expect.get(k, 0) + (1 if step % 3 else -1)
        eng.compact()
        pending = eng.view.relations["r"].trace.pending
        assert len(pending) <= 3
        assert sum(p.rows for p in pending) <= 8 * (step + 1)
    assert sorted((r["k"], r["time"], r["diff"]) for b in eng.replay("r") for r in b.to_pylist()) == sorted(
        (step % 4 * 10 + i, 100 + step, 1 if step % 3 else -1) for step in range(10) for i in range(8))
    eng.seal("r", 200)
    eng.compact()
    assert as_model(eng.snapshot("r", 200)) == {k: d for k, d in expect.items() if d}


@pytest.mark.embedded_only
def test_a_run_across_the_new_upper_is_split(eng, open_engine):
    eng.append("r", ups([1, 2, 3, 4], [5, 6, 7, 8]))
    eng.compact()
    (run,) = eng.view.relations["r"].trace.pending
    assert (run.lower, run.upper) == (5, 9)
    eng.seal("r", 6)
    eng.compact()
    trace = eng.view.relations["r"].trace
    assert trace.upper == 7 and [(p.lower, p.upper, p.rows) for p in trace.pending] == [(7, 9, 2)]
    assert as_model(eng.snapshot("r", 6)) == {1: 1, 2: 1}
    eng.close()
    again = open_engine(clock=ManualClock(), segment_bytes=64 << 20)  # compacter on, idle: passes run on compact()
    again.seal("r", 8)
    assert as_model(again.snapshot("r", 8)) == {1: 1, 2: 1, 3: 1, 4: 1}
    again.compact()
    assert as_model(again.snapshot("r", 8)) == {1: 1, 2: 1, 3: 1, 4: 1}


@pytest.mark.embedded_only
@pytest.mark.parametrize("seed", range(3))
def test_random_streams_match_a_model(eng, open_engine, seed):
    """Appends at random unsealed times, seals that lag, since moves and compactions in any
    order: every snapshot equals the brute-force sum, before and after reopening."""
    rnd = random.Random(seed)
    eng.settings.max_pending_runs = rnd.choice([1, 2, 4])
    updates: list[tuple[int, int, int]] = []
    sealed = -1
    for _ in range(60):
        op = rnd.random()
        if op < 0.5:
            n = rnd.randint(1, 20)
            rows = [(rnd.randint(0, 15), rnd.randint(sealed + 1, sealed + 30), rnd.choice([1, 1, -1, 2]))
                    for _ in range(n)]
            eng.append("r", ups(*map(list, zip(*rows, strict=True))))
            updates += rows
        elif op < 0.7:
            sealed = max(sealed, min(max([t for _k, t, _d in updates] or [0]), sealed + rnd.randint(1, 10)))
            eng.seal("r", sealed)
        elif op < 0.75 and sealed > 0:
            eng.set_since("r", rnd.randint(eng.since("r"), sealed))
        else:
            eng.compact()
        if sealed >= eng.since("r") and sealed >= 0:
            as_of = rnd.randint(eng.since("r"), sealed)
            want = {}
            for k, t, d in updates:
                if t <= as_of:
                    want[k] = want.get(k, 0) + d
            assert as_model(eng.snapshot("r", as_of)) == {k: d for k, d in want.items() if d}
    eng.close()
    again = open_engine(clock=ManualClock(), segment_bytes=64 << 20)  # compacter on, idle: passes run on compact()
    again.seal("r", 10_000)
    again.compact()
    want = {}
    for k, _t, d in updates:
        want[k] = want.get(k, 0) + d
    assert as_model(again.snapshot("r", 10_000)) == {k: d for k, d in want.items() if d}


CRASHER = textwrap.dedent("""
    import json, sys, pyarrow as pa, sediment
    eng = sediment.open(sys.argv[1], segment_bytes=1 << 14, compact_interval=0.01, **json.loads(sys.argv[2]))
    eng.settings.max_pending_runs = 2
    if "r" not in eng.relations():
        eng.add_relation("r", pa.schema([("k", pa.int64())]))
    stored = [b.column("time") for b in eng.replay("r")]  # an append may be durable before it was printed
    t = max([1] + [max(c.to_pylist()) + 1 for c in stored if len(c)])
    while True:
        n = 200
        eng.append("r", pa.table({"k": [t * 1000 + i for i in range(n)], "time": [t] * n, "diff": [1] * n}))
        if t > 7 and t % 3 == 0:
            eng.seal("r", t - 7)  # seals lag: runs stay pending, then fold or split
        if t % 2 == 0:
            eng.compact()
        print(t, flush=True)
        t += 1
""")


@pytest.mark.embedded_only
@pytest.mark.parametrize("seed", range(3))
def test_sigkill_with_pending_runs_keeps_every_acknowledged_update_once(open_engine, engine_options, tmp_path,
                                                                       seed):
    data = str(tmp_path / "data")
    rnd = random.Random(seed)
    acked = 0
    printed: list[list[int]] = []
    for round_ in range(3):
        with open(tmp_path / f"stderr{round_}", "w") as err:
            proc = subprocess.Popen([sys.executable, "-c", CRASHER, data, json.dumps(engine_options(str(data)))],
                                    stdout=subprocess.PIPE, stderr=err, text=True)
        stop_after = rnd.randint(5, 40)
        printed.append([])
        try:
            for n, line in enumerate(proc.stdout):
                printed[-1].append(int(line))
                acked = max(acked, int(line))
                if n >= stop_after:
                    break
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        for line in proc.stdout.read().split():  # printed before the kill landed, not yet read
            printed[-1].append(int(line))
            acked = max(acked, int(line))
    eng = open_engine(data, segment_bytes=1 << 14)  # background compaction on: replays race it
    eng.seal("r", 1 << 40)
    for attempt in range(2):
        got = {}
        for b in eng.replay("r"):
            for r in b.to_pylist():
                got[(r["k"], r["time"])] = got.get((r["k"], r["time"]), 0) + r["diff"]
        times = {t for _k, t in got}
        trace = eng.view.relations["r"].trace
        context = (f"attempt {attempt}, printed {printed}, trace {trace}, tail {eng.view.relations['r'].tail[:3]}.., "
                   f"wal {eng.wal.start_lsn}..{eng.wal.end_lsn}, stderr "
                   + " | ".join((tmp_path / f"stderr{i}").read_text()[-600:] for i in range(3)))
        assert set(range(1, acked + 1)) <= times <= set(range(1, acked + 2)), f"missing or extra: {context}"
        want = {(t * 1000 + i, t): 1 for t in times for i in range(200)}
        assert got == want, f"an update is missing or counted twice: {context}"
        eng.compact()
