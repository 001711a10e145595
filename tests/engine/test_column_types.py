"""Every common Arrow column type either works end to end (add_relation -> append -> seal ->
compact, with pending batches and merges -> snapshot -> replay -> reopen) and comes back as
itself, or is refused at add_relation with SchemaMismatch and nothing written (issue 12,
finding 7)."""

from __future__ import annotations

import datetime
import decimal

import pyarrow as pa
import pytest
from support.columns import WORKS
from test_bad_input import _one_line
from test_engine import SCHEMA, dir_digest, rows

import sediment
from sediment import errors

# --- Arrow types, end to end ------------------------------------------------------------------

D = decimal.Decimal
UTC = datetime.UTC
REFUSED = {
    "float16": pa.float16(),
    "list": pa.list_(pa.int32()),
    "large_list": pa.large_list(pa.int32()),
    "struct": pa.struct([("a", pa.int32())]),
    "map": pa.map_(pa.string(), pa.int32()),
    "dictionary": pa.dictionary(pa.int32(), pa.string()),
    "null": pa.null(),
}


def _values(t: pa.DataType, vals: list, times: list[int], diffs: list[int]) -> pa.Table:
    return pa.table({"id": pa.array(list(range(len(vals))), pa.int64()), "v": pa.array(vals, t),
                     "time": pa.array(times, pa.int64()), "diff": pa.array(diffs, pa.int64())})


@pytest.mark.parametrize("name", sorted(WORKS))
def test_accepted_arrow_types_work_end_to_end(tmp_path, name):
    """append -> seal -> compact (batches, a pending batch, merges) -> snapshot -> replay ->
    reopen: every accepted type comes back as itself, with the right values and diffs."""
    t, vals = WORKS[name]
    schema = pa.schema([("id", pa.int64()), ("v", t)])
    data = tmp_path / "data"
    updates: list[tuple] = []  # (id, v, time, diff): the model
    with sediment.open(data, compact_interval=None, merge_factor=1.5) as eng:
        eng.add_relation("r", schema)
        for round_ in range(4):
            base = 10 * round_
            diffs = [1, 2, -1] if round_ % 2 == 0 else [1, -2, 3]
            for times, ds in (([base + 1, base + 2, base + 3], diffs), ([base + 15] * 3, [5, 5, 5])):
                eng.append("r", _values(t, vals, times, ds))  # the second: above the seal, a pending batch
                updates += [(i, v, tm, d) for i, (v, tm, d) in enumerate(zip(vals, times, ds, strict=True))]
            eng.seal("r", base + 9)
            eng.compact()
        eng.set_since("r", 30)
        eng.compact()
        info = eng.trace_info("r")
        assert info["pending"] == 1 and info["tail_records"] == 0 and info["batches"] >= 1
        assert info["compaction_failures"] == 0 and eng.compaction_errors() == {}
        snap = eng.snapshot("r", 39)
        replayed = pa.Table.from_batches(list(eng.replay("r")))
    totals: dict[tuple, int] = {}
    for i, v, tm, d in updates:
        if tm <= 39:
            totals[(i, v)] = totals.get((i, v), 0) + d
    expected = sorted(((i, v, d) for (i, v), d in totals.items() if d), key=lambda r: r[0])
    assert snap.schema.field("v").type == t
    assert rows(snap) == expected
    assert replayed.schema.field("v").type == t
    advanced: dict[tuple, int] = {}
    for i, v, tm, d in updates:
        advanced[(i, v, max(tm, 30))] = advanced.get((i, v, max(tm, 30)), 0) + d
    got: dict[tuple, int] = {}
    for r in replayed.to_pylist():
        key = (r["id"], r["v"], max(r["time"], 30))  # history below since may or may not be advanced
        got[key] = got.get(key, 0) + r["diff"]
    assert {k: d for k, d in got.items() if d} == {k: d for k, d in advanced.items() if d}
    with sediment.open(data, compact_interval=None) as eng:
        again = eng.snapshot("r", 39)
        assert again.schema == snap.schema and rows(again) == expected


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_arrow_types_are_schema_mismatch_at_add_relation(tmp_path, name):
    with sediment.open(tmp_path / "data", compact_interval=None) as eng:
        eng.add_relation("orders", SCHEMA)
        digest = dir_digest(tmp_path / "data")
        with pytest.raises(errors.SchemaMismatch) as err:
            eng.add_relation("r", pa.schema([("id", pa.int64()), ("v", REFUSED[name])]))
        assert "'v'" in _one_line(err.value) and str(REFUSED[name]) in str(err.value)
        assert eng.relations() == ["orders"]
        assert dir_digest(tmp_path / "data") == digest
