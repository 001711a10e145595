"""Random sequences of appends, seals, alters, compactions and reopens against a Python model
that applies the same schema changes: the snapshot at every sealed time equals the model's.
On the file log, on the device ring, on the replicated log, and through a server (network
client)."""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import uuid
from collections import defaultdict

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import sediment

TYPES = {"int32": pa.int32(), "int64": pa.int64(), "str": pa.string()}
VALUES = {"int32": st.sampled_from([0, 1, 2, None]), "int64": st.sampled_from([0, 1, 2, None]),
          "str": st.sampled_from(["x", "y", None])}


class SchemaModel:
    """Columns by field id, updates as {field id: value}, projection as the issue states it."""

    def __init__(self) -> None:
        self.columns = [(1, "c1", "int32"), (2, "c2", "str")]  # (field id, name, kind)
        self.next_id = 3
        self.defaults: dict[int, object] = {}
        self.updates: list[tuple[dict[int, object], int, int]] = []
        self.sealed = -1

    def schema(self) -> pa.Schema:
        return pa.schema([(name, TYPES[kind]) for _fid, name, kind in self.columns])

    def snapshot(self, as_of: int) -> list[tuple]:
        acc: dict[tuple, int] = defaultdict(int)
        for values, t, d in self.updates:
            if t <= as_of:
                acc[tuple(values[fid] if fid in values else self.defaults.get(fid)
                          for fid, _n, _k in self.columns)] += d
        return sorted(((*row, d) for row, d in acc.items() if d), key=_order)


def _order(row):
    return tuple((v is None, v) for v in row)


class SchemaMachine(RuleBasedStateMachine):
    wal: str | None = None

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="sediment-schema-model-")
        self.model = SchemaModel()
        self.engine = None
        self.options: dict = {"compact_interval": None}
        if self.wal == "device":
            self.options.update(wal="device:" + os.path.join(self.dir, "ring"), wal_capacity=8 << 20)

    @initialize()
    def start(self):
        self.engine = sediment.open(os.path.join(self.dir, "data"), **self.options)
        self.engine.add_relation("r", self.model.schema())

    @rule(data=st.data())
    def append(self, data):
        n = data.draw(st.integers(1, 4))
        lo = self.model.sealed + 1
        omit = {fid for fid, _n, _k in self.model.columns if fid > 2 and data.draw(st.booleans())}
        rows = []
        for _ in range(n):
            values = {fid: data.draw(VALUES[kind]) for fid, _n, kind in self.model.columns if fid not in omit}
            for fid in omit:
                values[fid] = self.model.defaults.get(fid)
            rows.append((values, data.draw(st.integers(lo, lo + 2)), data.draw(st.sampled_from([-1, 1, 1, 2]))))
        cols = {name: pa.array([v[fid] for v, _t, _d in rows], TYPES[kind])
                for fid, name, kind in self.model.columns if fid not in omit}
        cols["time"] = pa.array([t for _v, t, _d in rows], pa.int64())
        cols["diff"] = pa.array([d for _v, _t, d in rows], pa.int64())
        self.engine.append("r", pa.table(cols))
        self.model.updates += rows

    @rule(dt=st.integers(0, 2))
    def seal(self, dt):
        t = self.model.sealed + dt
        if t >= 0:
            self.engine.seal("r", t)
            self.model.sealed = t

    @rule(kind=st.sampled_from(["int32", "str"]), default=st.booleans())
    def add_column(self, kind, default):
        m = self.model
        name = f"c{m.next_id}" if len(m.columns) % 2 or not self._dropped_names() else self._dropped_names()[0]
        value = (7 if kind == "int32" else "d") if default else None
        self.engine.alter_relation("r", add=[pa.field(name, TYPES[kind])],
                                   defaults={name: value} if default else None)
        if default:
            m.defaults[m.next_id] = value
        m.columns.append((m.next_id, name, kind))
        m.next_id += 1

    @precondition(lambda self: len(self.model.columns) > 1)
    @rule(data=st.data())
    def drop_column(self, data):
        fid, name, _kind = data.draw(st.sampled_from(self.model.columns))
        self.engine.alter_relation("r", drop=[name])
        self.model.columns = [c for c in self.model.columns if c[0] != fid]
        self._dropped.append(name)

    @rule(data=st.data())
    def rename_column(self, data):
        fid, name, kind = data.draw(st.sampled_from(self.model.columns))
        new = f"{name}_r"
        if any(n == new for _f, n, _k in self.model.columns) or len(new) > 40:
            return
        self.engine.alter_relation("r", rename={name: new})
        self.model.columns = [(f, new if f == fid else n, k) for f, n, k in self.model.columns]

    @rule(data=st.data())
    def widen_column(self, data):
        narrow = [c for c in self.model.columns if c[2] == "int32"]
        if not narrow:
            return
        fid, name, _kind = data.draw(st.sampled_from(narrow))
        self.engine.alter_relation("r", widen={name: pa.int64()})
        self.model.columns = [(f, n, "int64" if f == fid else k) for f, n, k in self.model.columns]

    @rule()
    def compact(self):
        self.engine.compact("r")

    @rule()
    def reopen(self):
        self.engine.close()
        self.engine = sediment.open(os.path.join(self.dir, "data"), **self.options)

    _dropped: list[str]

    def _dropped_names(self) -> list[str]:
        taken = {n for _f, n, _k in self.model.columns}
        return [n for n in getattr(self, "_dropped", []) if n not in taken]

    @precondition(lambda self: self.engine is not None)
    @invariant()
    def snapshots_match_the_model(self):
        assert self.engine.schema("r") == self.model.schema()
        for as_of in range(0, self.model.sealed + 1):
            got = sorted((tuple(r.values()) for r in self.engine.snapshot("r", as_of).to_pylist()), key=_order)
            assert got == self.model.snapshot(as_of), as_of

    def teardown(self):
        if self.engine is not None:
            self.engine.close()
        shutil.rmtree(self.dir, ignore_errors=True)


SchemaMachine._dropped = []


class FileLogMachine(SchemaMachine):
    wal = None

    def __init__(self) -> None:
        super().__init__()
        self._dropped = []


class DeviceRingMachine(SchemaMachine):
    wal = "device"

    def __init__(self) -> None:
        super().__init__()
        self._dropped = []


class ServedMachine(SchemaMachine):
    """The same sequences through a server: every call goes over the network client."""

    def __init__(self) -> None:
        super().__init__()
        self._dropped = []
        self._local = self._server = None

    def _serve(self) -> None:
        from sediment.server import SedimentFlightServer

        self._local = sediment.open(os.path.join(self.dir, "data"), **self.options)
        self._server = SedimentFlightServer(self._local, "grpc://127.0.0.1:0", TOKEN)
        self.engine = sediment.connect(self._server.uri, token=TOKEN)

    def _stop(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self._server.stop()
            self._local.close()
            self.engine = None

    @initialize()
    def start(self):
        self._serve()
        self.engine.add_relation("r", self.model.schema())

    @rule()
    def reopen(self):
        self._stop()
        self._serve()

    def teardown(self):
        self._stop()
        shutil.rmtree(self.dir, ignore_errors=True)


TOKEN = "schema-model-token"
_SETTINGS = settings(max_examples=25, stateful_step_count=20, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
FileLogMachine.TestCase.settings = _SETTINGS
DeviceRingMachine.TestCase.settings = _SETTINGS
ServedMachine.TestCase.settings = settings(_SETTINGS, max_examples=10)
TestSchemaModelFileLog = FileLogMachine.TestCase
TestSchemaModelDeviceRing = DeviceRingMachine.TestCase
TestSchemaModelServed = ServedMachine.TestCase


@pytest.mark.zookeeper
def test_schema_model_on_the_replicated_log(zookeeper, nodes):
    """The same sequences on the replicated log (three storage nodes, metadata in ZooKeeper):
    each example gets its own log partition on the nodes and its own ZooKeeper root, so a
    reopen recovers the WAL records' schema versions from the nodes."""
    from support.replication import KEY

    partitions = itertools.count(1)
    root = f"/sediment-test/schema-model-{uuid.uuid4().hex[:8]}"

    class ReplicatedMachine(SchemaMachine):
        def __init__(self) -> None:
            super().__init__()
            self._dropped = []
            n = next(partitions)
            self.options.update(replicas=[node.address for node in nodes], cluster_key=str(KEY),
                                metadata=f"zk://{zookeeper.hosts}{root}/p{n}", log_partition=n,
                                blob=f"file://{os.path.join(self.dir, 'blobs')}")

        def teardown(self):
            if self.engine is not None:
                assert self.engine.stats()["wal"]["kind"] == "replicated"
            super().teardown()

    run_state_machine_as_test(ReplicatedMachine, settings=settings(_SETTINGS, max_examples=6))
