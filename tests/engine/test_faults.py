"""A slice of the fault campaign (bench/faults.py) in the suite: real child processes killed with
SIGKILL, real files damaged, crash states built from the workload's recorded file-system
calls. Each test asserts the campaign's zeros for one kind of fault.

The tests that were marked ``xfail`` (defects of issue 12 the campaign found) now pass and
run as plain tests; a new defect gets a new test, marked ``xfail`` until it is fixed.
"""

from __future__ import annotations

import os

import pytest
from support import faults_damage as fd
from support import faults_kills as fk
from support import faults_model as fm
from support import faults_power as fp

import sediment

SEED = 12


def _assert_kill_zeros(stats: fk.KillStats) -> None:
    assert stats.trials > 0
    bad = {k: getattr(stats, k) for k in ("lost", "partial", "wrong", "refused", "untyped", "hangs", "disagree")}
    assert not any(bad.values()), (bad, stats.failures[:3])


@pytest.mark.slow
def test_kills_on_the_file_log_lose_nothing(tmp_path):
    """SIGKILL at random points of appends, transactions, seals, set_since, compaction, rollover
    and open: every acknowledged update is there, no transaction in part, verify agrees."""
    stats = fk.run_kills(str(tmp_path), "file", 14, SEED, fk.KillStats(), log=lambda _l: None)
    _assert_kill_zeros(stats)
    assert len(stats.phases) >= 3  # the kills landed in several phases, not all at one point


@pytest.mark.slow
@pytest.mark.parametrize("steps", ["roll", "all"])
def test_kills_inside_segment_rolls_and_recycling_never_need_a_repair(tmp_path, monkeypatch, steps):
    """Issue 23: every kill lands inside an engine step ("roll": a new segment sized but
    without its header, or a roll not yet recorded; "all": trims and pool reuses and offers
    too), with segment sizes changing between opens and half of the checking opens using
    the defaults: no open is refused (nor the one after it), nothing is lost, verify agrees.
    On the code before the fix the "roll" case found 4 refused opens in 12 kill points
    ("file is 67108864 bytes, recorded ...")."""
    if steps == "roll":
        monkeypatch.setattr(fk, "STEPS", fk.STEPS[:2])
    stats = fk.KillStats()
    fk.run_kills(str(tmp_path), "file", 12, SEED, stats, log=lambda _l: None, step_share=1.0)
    _assert_kill_zeros(stats)
    assert sum(n for phase, n in stats.phases.items() if phase.startswith("step ")) >= 6, stats.phases


@pytest.mark.slow
def test_kills_on_the_device_ring_lose_nothing(tmp_path):
    """The same on the device ring (``wal="device:<file>"``)."""
    stats = fk.run_kills(str(tmp_path), "device", 14, SEED, fk.KillStats(), log=lambda _l: None)
    _assert_kill_zeros(stats)


@pytest.mark.slow
def test_power_loss_states_lose_nothing(tmp_path):
    """Crash states under POSIX rules (unsynced writes and directory entries dropped, kept, or
    torn): each opens with everything acknowledged before the cut, no transaction in part."""
    stats = fp.run_power(str(tmp_path), SEED, 48, fp.PowerStats(), nops=30, log=lambda _l: None)
    assert stats.states == 48
    bad = {k: getattr(stats, k) for k in ("lost", "partial", "wrong", "refused", "untyped")}
    assert not any(bad.values()), (bad, stats.failures[:3])


@pytest.mark.slow
def test_power_loss_states_with_segment_recycling_lose_nothing(tmp_path):
    """Issue 23: a workload whose segment size changes between opens offers trimmed segment
    files to the recycle pool and reuses them; crash states cut after a reuse open with
    nothing lost and none refused, with the default options or the recorded ones. Seed 18:
    a workload that reuses pool files (seed 14's no longer does since alters joined the workload)."""
    stats = fp.run_power(str(tmp_path), 18, 48, fp.PowerStats(), nops=30, log=lambda _l: None)
    assert stats.pool_offers >= 1 and stats.pool_takes >= 1 and stats.states_after_reuse >= 1, stats
    bad = {k: getattr(stats, k) for k in ("lost", "partial", "wrong", "refused", "untyped", "disagree")}
    assert not any(bad.values()), (bad, stats.failures[:3])


@pytest.mark.slow
def test_power_loss_while_creating_verify_agrees_with_open(tmp_path):
    """Crash states early in the workload (data directory, log and metadata being created):
    verify exits 0 exactly when open gives everything acknowledged."""
    stats = fp.run_power(str(tmp_path), 5, 40, fp.PowerStats(), nops=10, log=lambda _l: None, first=200)
    assert stats.disagree == 0, stats.failures[:3]


# --- damage: one pristine directory per log, every damage kind on one file kind per test -------


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """name -> (build dir, pristine copy, model, frames, kinds, needed LSN), built on first use."""
    import shutil

    built = {}

    def get(wal: str):
        if wal not in built:
            work = tmp_path_factory.mktemp(f"damage-{wal}")
            build, copy = str(work / "build"), str(work / "pristine")
            model = fd.build_pristine(build, wal, SEED)
            shutil.copytree(build, copy)
            built[wal] = (build, copy, model, fd.log_frames(copy, wal), fd.list_files(copy), fd.needed_lsn(copy))
        return built[wal]

    return get


def _damage(pristine, wal: str, kind: str, rounds: int = 2) -> list[dict]:
    build, copy, model, frames, kinds, needed = pristine(wal)
    assert kind in kinds, sorted(kinds)
    pos, n = sorted(kinds).index(kind), len(kinds)
    results = []
    for k in range(rounds * len(fd.DAMAGES)):
        spec = fd.plan_trial(kinds, SEED, k * n + pos, lambda p: os.path.getsize(os.path.join(copy, p)))
        assert spec["kind"] == kind
        results.append(fd.run_trial(build, copy, wal, model, frames, spec, needed))
    assert {r["spec"]["damage"] for r in results} == set(fd.DAMAGES)
    return results


def _assert_damage_zeros(results: list[dict]) -> None:
    bad = [(r["spec"]["kind"], r["spec"]["damage"], r["class"], r["verify"], r["destroyed"], r.get("detail", "")[:120])
           for r in results if r["class"] not in ("same", "typed", "reported") or not r["agree"] or r["destroyed"]]
    assert not bad, bad


@pytest.mark.slow
def test_damaged_metadata_snapshot_is_a_typed_error(pristine):
    _assert_damage_zeros(_damage(pristine, "file", "meta-snapshot"))


@pytest.mark.slow
def test_damaged_batch_is_detected(pristine):
    _assert_damage_zeros(_damage(pristine, "file", "batch", rounds=2))


@pytest.mark.slow
def test_damaged_batch_footer_is_detected(pristine):
    """Bit flips in each batch's Parquet footer (issue 12 finding 5): a typed error, verify agrees."""
    build, copy, model, frames, kinds, needed = pristine("file")
    assert kinds.get("batch"), f"the pristine directory holds no batch to damage: {sorted(kinds)}"
    results = []
    for path in kinds["batch"]:
        size = os.path.getsize(os.path.join(copy, path))
        for back in (9, 24, 48, 96, 160, 240, 320, 400):
            spec = {"kind": "batch", "path": path, "damage": "bitflip", "size": size,
                    "bits": [[max(0, size - back), back % 8]], "index": -1}
            results.append(fd.run_trial(build, copy, "file", model, frames, spec, needed))
    _assert_damage_zeros(results)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["seg-first", "seg-last"])
def test_damaged_segment_is_detected(pristine, kind):
    _assert_damage_zeros(_damage(pristine, "file", kind))


@pytest.mark.slow
def test_damaged_control_file_is_detected(pristine):
    _assert_damage_zeros(_damage(pristine, "file", "control"))


@pytest.mark.slow
def test_damaged_index_verify_agrees_with_open(pristine):
    _assert_damage_zeros(_damage(pristine, "file", "index"))


@pytest.mark.slow
def test_damaged_metadata_journal_is_detected(pristine):
    """A damaged journal is a typed error, or a torn tail the open reports (a cut journal loses
    the entries the cut removed: reported, and verify says so)."""
    _assert_damage_zeros(_damage(pristine, "file", "meta-journal"))


@pytest.mark.slow
def test_damaged_device_ring_is_detected(pristine):
    _assert_damage_zeros(_damage(pristine, "device", "ring", rounds=3))


@pytest.mark.slow
def test_kills_inside_alters_are_all_or_nothing(tmp_path, monkeypatch):
    """Issue 26: alters are frequent and every kill lands just before or just after an alter's
    (or a set_since's) catalog write: the reopened engine holds the relation's columns and
    rows as before the alter or as after it, never a mix, and nothing acknowledged is lost."""
    monkeypatch.setattr(fm, "ALTER_WEIGHT", 0.3)
    monkeypatch.setattr(fk, "STEPS", tuple(s for s in fk.STEPS if s[0].startswith("sediment.engine.catalog")))
    stats = fk.KillStats()
    fk.run_kills(str(tmp_path), "file", 12, SEED, stats, log=lambda _l: None, step_share=1.0)
    _assert_kill_zeros(stats)
    assert sum(n for phase, n in stats.phases.items() if "Catalog.update" in phase) >= 2, stats.phases


@pytest.mark.slow
def test_power_loss_states_inside_joined_records_lose_nothing(tmp_path):
    """Concurrent bursts of small appends, which the file log's leader writes as joined
    records (one group body each): the recorded calls hold joined records, crash states cut
    between a joined record's write and its fdatasync and between the sync and the appends'
    return, and every state holds each acknowledged append, each unacknowledged one entirely
    or not at all, nothing refused."""
    stats = fp.PowerStats()
    for seed in (12, 18, 24, 30, 36, 42):  # whether appends meet in the log is timing: until some did
        fp.run_power(str(tmp_path), seed, 24, stats, nops=30, log=lambda _l: None)
        if stats.traces >= 2 and stats.joined_records and stats.states_in_joined:
            break
    assert stats.bursts >= 2 and stats.joined_records >= 1 and stats.states_in_joined >= 1, stats
    bad = {k: getattr(stats, k) for k in ("lost", "partial", "wrong", "refused", "untyped", "disagree")}
    assert not any(bad.values()), (bad, stats.failures[:3])


@pytest.mark.parametrize("wal", ["file", "device"])
def test_a_surviving_alter_of_a_relation_without_rows_is_in_the_checked_model(tmp_path, wal):
    """An alter in flight at a kill may survive or not. On a relation without rows its
    columns show in no row, so the check must compare the columns themselves: it used to
    take the model without the alter, and the relation's next rows (carrying the added
    column's default) then read as lost acknowledged updates (kill trial 20 of
    ``faults --quick --seed 172 --wal device``, blamed on the device ring)."""
    opts = fk.wal_options(wal, str(tmp_path))
    model = fm.Model()
    alter = ["alter", fm.OPTIONAL, "add", "x0_712202", 55]
    with sediment.open(str(tmp_path / "data"), **opts) as engine:
        for op in (["add", "a"], ["add", "b"], ["add", fm.OPTIONAL]):
            fm.run_op(engine, op)
            model.apply(op)
        fm.run_op(engine, alter)  # acknowledged by the engine, never reported: the kill came first
        check = fm.check_engine(engine, model, alter)
        assert check.ok, check.detail
        assert check.model.extra[fm.OPTIONAL] == [["x0_712202", 55]]
        unknown = fm.check_engine(engine, model, None)
        assert not unknown.ok and "columns" in unknown.detail, unknown
        fm.run_op(engine, ["append", fm.OPTIONAL, [[9, 0, 2]]])
        model = check.model
        model.apply(["append", fm.OPTIONAL, [[9, 0, 2]]])
        assert fm.check_engine(engine, model, None).ok


def test_options_that_both_explain_an_engine_are_kept_only_when_no_later_check_tells_them_apart(tmp_path):
    """An in-flight append whose updates cancel out is invisible: the engine is explained with
    it and without it, and the check keeps one (the chain goes on from it). That is sound
    only while nothing a later check or the next operation reads differs between the two;
    ``_differs`` is that test, and it must see what the check compares (columns included:
    once they were not compared, and a surviving alter read later as lost updates)."""
    opts = fk.wal_options("file", str(tmp_path))
    model = fm.Model()
    cancelling = ["append", "a", [[5, 3, 1], [5, 3, -1]]]
    with sediment.open(str(tmp_path / "data"), **opts) as engine:
        for op in (["add", "a"], ["add", "b"], ["add", fm.OPTIONAL], ["append", "a", [[1, 2, 1]]]):
            fm.run_op(engine, op)
            model.apply(op)
        fm.run_op(engine, cancelling)
        check = fm.check_engine(engine, model, cancelling)
        assert check.ok, check.detail
        assert fm._differs(model, model.with_op(cancelling)) == ""
    assert "columns" in fm._differs(model, model.with_op(["alter", fm.OPTIONAL, "add", "x", 7]))
    assert "consolidated" in fm._differs(model, model.with_op(["append", "a", [[5, 3, 1]]]))
    assert "frontiers" in fm._differs(model, model.with_op(["seal", "a", 4]))
    assert "relations" in fm._differs(model, model.with_op(["drop", fm.OPTIONAL]))
