"""Random streams of appends, seals, since moves and restarts against a plain Python model."""

from __future__ import annotations

import shutil
import tempfile
from collections import defaultdict

import pyarrow as pa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import sediment
from sediment import errors

RELATIONS = ("a", "b")
SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])


class Model:
    """The semantics, written as plainly as possible."""

    def __init__(self):
        self.updates = defaultdict(list)  # rel -> [(k, v, time, diff)]
        self.sealed = dict.fromkeys(RELATIONS, -1)
        self.since = dict.fromkeys(RELATIONS, 0)

    def snapshot(self, rel, as_of):
        acc = defaultdict(int)
        for k, v, t, d in self.updates[rel]:
            if t <= as_of:
                acc[(k, v)] += d
        return sorted((k, v, d) for (k, v), d in acc.items() if d != 0)


class EngineMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="sediment-model-")
        self.model = Model()
        self.engine = None
        self.options = {}

    @initialize(segment_bytes=st.sampled_from([1 << 12, 1 << 16]), max_record_bytes=st.sampled_from([1024, 1 << 20]))
    def start(self, segment_bytes, max_record_bytes):
        self.options = {"segment_bytes": segment_bytes, "max_record_bytes": max_record_bytes}
        self.engine = sediment.open(self.dir, **self.options)
        for rel in RELATIONS:
            self.engine.add_relation(rel, SCHEMA)

    @rule(rel=st.sampled_from(RELATIONS), data=st.data())
    def append(self, rel, data):
        n = data.draw(st.integers(0, 6))
        lo = self.model.sealed[rel] + 1
        batch = [(data.draw(st.integers(0, 4)), data.draw(st.sampled_from(["x", "y", ""])),
                  data.draw(st.integers(lo, lo + 4)), data.draw(st.integers(-2, 2))) for _ in range(n)]
        self.engine.append(rel, _table(batch))
        self.model.updates[rel] += batch

    @rule(rel=st.sampled_from(RELATIONS), dt=st.integers(1, 3))
    def append_sealed_time_is_refused(self, rel, dt):
        if self.model.sealed[rel] < 0:
            return
        t = max(0, self.model.sealed[rel] - dt + 1)
        try:
            self.engine.append(rel, _table([(1, "x", t, 1)]))
        except errors.TimeAlreadySealed:
            return
        raise AssertionError("append at a sealed time was accepted")

    @rule(data=st.data())
    def append_many(self, data):
        parts = {}
        for rel in RELATIONS:
            lo = self.model.sealed[rel] + 1
            parts[rel] = [(data.draw(st.integers(0, 4)), "m", data.draw(st.integers(lo, lo + 3)), 1)]
        self.engine.append_many({rel: _table(b) for rel, b in parts.items()})
        for rel, b in parts.items():
            self.model.updates[rel] += b

    @rule(data=st.data(), commit=st.booleans())
    def transaction(self, data, commit):
        tx = self.engine.transaction()
        staged = []
        for rel in RELATIONS:
            lo = self.model.sealed[rel] + 1
            batch = [(data.draw(st.integers(0, 4)), "t", data.draw(st.integers(lo, lo + 3)), 1)]
            tx.append(rel, _table(batch))
            staged.append((rel, batch))
        if commit:
            tx.commit()
            for rel, batch in staged:
                self.model.updates[rel] += batch
        else:
            tx.abort()

    @rule(rel=st.sampled_from(RELATIONS), dt=st.integers(0, 4))
    def seal(self, rel, dt):
        t = max(0, self.model.sealed[rel] + dt)
        self.engine.seal(rel, t)
        self.model.sealed[rel] = t

    @rule(rel=st.sampled_from(RELATIONS), dt=st.integers(0, 3))
    def set_since(self, rel, dt):
        t = min(self.model.since[rel] + dt, self.model.sealed[rel])
        if t < self.model.since[rel]:
            return
        self.engine.set_since(rel, t)
        self.model.since[rel] = t

    @rule(which=st.sampled_from([None, *RELATIONS]))
    def compact(self, which):
        self.engine.compact(which)

    @rule()
    def restart(self):
        self.engine.close()
        self.engine = sediment.open(self.dir, **self.options)

    @precondition(lambda self: self.engine is not None)
    @invariant()
    def snapshots_match_the_model(self):
        for rel in RELATIONS:
            # replay is every stored update; compacted ones may have times advanced to at most since
            replayed = [tuple(r.values()) for b in self.engine.replay(rel) for r in b.to_pylist()]
            times = [t for _k, _v, t, _d in replayed]
            assert times == sorted(times)
            s = self.model.since[rel]
            assert _consolidated(replayed, s) == _consolidated(self.model.updates[rel], s), rel
            assert self.engine.sealed(rel) == self.model.sealed[rel]
            assert self.engine.since(rel) == self.model.since[rel]
            for as_of in range(self.model.since[rel], self.model.sealed[rel] + 1):
                got = [tuple(r.values()) for r in self.engine.snapshot(rel, as_of).to_pylist()]
                assert got == self.model.snapshot(rel, as_of), (rel, as_of)

    def teardown(self):
        if self.engine is not None:
            self.engine.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def _consolidated(updates, since):
    acc = defaultdict(int)
    for k, v, t, d in updates:
        acc[(k, v, max(t, since))] += d
    return sorted((key, d) for key, d in acc.items() if d)


def _table(batch):
    ks, vs, ts, ds = zip(*batch, strict=True) if batch else ((), (), (), ())
    return pa.table({"k": pa.array(ks, pa.int64()), "v": pa.array(vs, pa.string()),
                     "time": pa.array(ts, pa.int64()), "diff": pa.array(ds, pa.int64())})


EngineMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestEngineModel = EngineMachine.TestCase
