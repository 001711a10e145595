"""Replaced batches and the WAL below the trim point go once no reader that may need them is
held (engine/collector.py): readers are told apart by the generation they started in, so
readers whose lifetimes always overlap (a read plan a minute under 600 s leases, snapshots
back to back from several clients) hold back only what was replaced while the oldest of them
runs, not every deletion and every trim for as long as they overlap."""

from __future__ import annotations

import random

import pyarrow as pa

import sediment
from sediment.clock import ManualClock
from sediment.engine.collector import Collector, ReaderPins

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])


def rows(ids: range, t: int) -> pa.Table:
    return pa.table({"id": pa.array(list(ids), pa.int64()), "v": pa.array([f"value {i}" * 4 for i in ids]),
                     "time": pa.array([t] * len(ids), pa.int64()), "diff": pa.array([1] * len(ids), pa.int64())})


def test_rolling_read_leases_let_what_they_do_not_need_go(tmp_path):
    """A read plan always leased (each taken before the one before is released), a pass after
    each: every plan's batches stay readable while it is held, and the log is trimmed and
    replaced batches deleted all the same."""
    clock = ManualClock()
    with sediment.open(tmp_path / "d", clock=clock, segment_bytes=1 << 12) as eng:
        eng.add_relation("r", SCHEMA)
        start, held, trims, ever = eng.wal.start_lsn, None, [], set()
        for step in range(1, 10):
            eng.append("r", rows(range(step * 100, step * 100 + 40), step))
            eng.seal("r", step)
            plan = eng.plan_read("r", as_of=step, lease_seconds=600)
            if held is not None:
                eng.release_read(held.lease)
            held = plan
            eng.compact()
            eng.compaction.merge_relation(eng.view.relations["r"], full=True)
            stored = set(eng.traces.blobs.list("trace/"))
            assert {b["key"] for b in plan.batches} <= stored, f"step {step}: a batch of the held plan was deleted"
            ever |= stored
            trims.append(eng.wal.start_lsn)
            assert len(eng.collector.readers.leases) == 1
        assert trims[-1] > start, f"the WAL was never trimmed under rolling leases: start LSNs {trims}"
        kept = set(eng.traces.blobs.list("trace/"))
        assert len(ever - kept) >= 10, f"replaced batches kept under rolling leases: {len(kept)} of {len(ever)} stored"
        eng.release_read(held.lease)
        got = eng.snapshot("r", 9).column("id").to_pylist()
        assert sorted(got) == [i for step in range(1, 10) for i in range(step * 100, step * 100 + 40)]


def test_back_to_back_replays_let_the_log_be_trimmed(tmp_path):
    """Two replays in turn, each started before the other ends: the log is still trimmed."""
    with sediment.open(tmp_path / "d", clock=ManualClock(), segment_bytes=1 << 12) as eng:
        eng.add_relation("r", SCHEMA)
        start, older = eng.wal.start_lsn, None
        for step in range(1, 8):
            eng.append("r", rows(range(step * 100, step * 100 + 40), step))
            eng.seal("r", step)
            newer = eng.replay("r")
            if older is not None:
                assert sum(b.num_rows for b in older) == 40 * (step - 1)  # ends it: unpinned
            older = newer
            eng.compact()
        assert eng.wal.start_lsn > start, "the log was never trimmed under overlapping replays"
        assert sum(b.num_rows for b in older) == 40 * 7


class _Recorded:
    """Stands for the trace store and the log: records what the collector deletes and trims."""

    def __init__(self) -> None:
        self.deleted: list[str] = []
        self.trimmed: list[int] = []

    def delete(self, keys: list[str]) -> None:
        self.deleted += keys

    def trim(self, lsn: int) -> None:
        self.trimmed.append(lsn)


def test_collector_against_a_model() -> None:
    """Random reads, leases, merges, discards, trims and clock moves. Safety: nothing a held
    reader (or merge, for blobs) could have seen is deleted or trimmed away. Progress: what
    no held reader started before is gone at the next collection, and everything is once
    all are done."""
    import threading

    for seed in range(300):
        rnd = random.Random(seed)
        clock, store = ManualClock(), _Recorded()
        collector = Collector(threading.RLock(), ReaderPins(clock), store, store)
        step = 0
        live: set[str] = set()  # blobs a trace still names
        readers: dict[int, tuple[set[str], int, int]] = {}  # reader -> (blobs it saw, trim floor, step)
        pins: dict[int, int] = {}  # reader -> pin token
        leases: dict[int, int] = {}  # reader -> lease id
        merges = []  # open merge contexts: (context, blobs it saw, step)
        made: dict[str, int] = {}  # garbage -> step discarded
        trims: list[tuple[int, int]] = []  # (step, lsn)
        floor = 0  # the lowest LSN a trace still needs
        for n in range(60):
            step += 1
            op = rnd.randrange(8)
            if op == 0:
                key = f"b{seed}-{n}"
                live.add(key)
            elif op == 1 and live:
                gone = set(rnd.sample(sorted(live), rnd.randint(1, len(live))))
                live -= gone
                with collector.lock:
                    collector.discard(sorted(gone))
                made.update({k: step for k in gone})
            elif op == 2:
                floor += rnd.randint(0, 5)
                with collector.lock:
                    collector.trim_below(floor)
                trims.append((step, floor))
            elif op == 3:
                with collector.lock:
                    reader = n
                    if rnd.random() < 0.5:
                        pins[reader] = collector.pin()
                    else:
                        leases[reader] = collector.readers.lease(rnd.choice([1.0, 5.0, 60.0]))
                readers[reader] = (set(live), floor, step)
            elif op == 4 and readers:
                reader = rnd.choice(sorted(readers))
                del readers[reader]
                if reader in pins:
                    collector.unpin(pins.pop(reader))
                else:
                    collector.release(leases.pop(reader))
            elif op == 5:
                context = collector.merge_running()
                context.__enter__()
                merges.append((context, set(live), step))
            elif op == 6 and merges:
                context, _, _ = merges.pop(rnd.randrange(len(merges)))
                context.__exit__(None, None, None)
            else:
                clock.advance(rnd.choice([0.5, 2.0, 10.0]))
                for reader, lease in list(leases.items()):
                    if lease not in collector.readers.leases or \
                            collector.readers.leases[lease] <= clock.current_time():
                        del readers[reader], leases[reader]
                collector.collect()
            collector.collect()
            deleted, trimmed = set(store.deleted), max(store.trimmed, default=0)
            for seen, low, _ in readers.values():
                assert not seen & deleted, f"seed {seed}: a blob deleted under a reader that saw it"
                assert trimmed <= low, f"seed {seed}: the log trimmed to {trimmed} under a reader that needs {low}"
            for _, seen, _ in merges:
                assert not seen & deleted, f"seed {seed}: a blob deleted under a merge that saw it"
            oldest = min([s for _, _, s in readers.values()], default=None)
            blob_hold = min([s for _, _, s in (*readers.values(), *merges)], default=None)
            due = {k for k, s in made.items() if blob_hold is None or s < blob_hold}
            assert due <= deleted, f"seed {seed} step {step}: {sorted(due - deleted)} kept with no reader needing them"
            due_trim = max([lsn for s, lsn in trims if oldest is None or s < oldest], default=0)
            assert trimmed >= due_trim, f"seed {seed} step {step}: trimmed to {trimmed}, {due_trim} was due"
            assert deleted <= set(made)
        for context, _, _ in merges:
            context.__exit__(None, None, None)
        for reader in list(readers):
            if reader in pins:
                collector.unpin(pins.pop(reader))
            else:
                collector.release(leases.pop(reader))
        collector.collect()
        assert set(store.deleted) == set(made) and len(store.deleted) == len(made)
        assert max(store.trimmed, default=0) == floor or not trims


def test_a_plan_from_before_a_reopen_releases_no_lease_of_the_new_engine(tmp_path):
    """Lease ids do not start again at each open: a reader's late release of a plan it got from
    the engine before a reopen (a cluster member reopens a partition in the same generation)
    must not end the lease of another reader's plan, whose batches would then go."""
    with sediment.open(tmp_path / "d") as eng:
        eng.add_relation("r", SCHEMA)
        eng.append("r", rows(range(10), 1))
        eng.seal("r", 1)
        old = eng.plan_read("r", as_of=1)
    with sediment.open(tmp_path / "d") as eng:
        new = eng.plan_read("r", as_of=1)
        eng.release_read(old.lease)
        assert new.lease in eng.collector.readers.leases, "a release of the old engine's plan ended a new lease"
        eng.release_read(new.lease)
        assert not eng.collector.readers.leases
