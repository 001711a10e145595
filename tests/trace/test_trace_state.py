"""TraceState: JSON round trip and the invariants that guard compaction."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sediment.errors import TraceError, TraceInvariantViolation
from sediment.trace.batch import batch_key
from sediment.trace.state import BatchRef, TraceState

REL = 9


def ref(lo: int, hi: int, rows: int = 1, nonce: str = "n0", rel: int = REL, level: int = 0) -> BatchRef:
    if rows == 0:
        return BatchRef(None, lo, hi)
    return BatchRef(batch_key(rel, lo, hi, nonce), lo, hi, rows, rows * 10, level)


@st.composite
def states(draw):
    bounds = sorted(set(draw(st.lists(st.integers(0, 2**63), min_size=0, max_size=12))))
    if len(bounds) == 1:
        bounds = []
    batches = tuple(
        ref(lo, hi, draw(st.integers(0, 1000)), f"n{i}", level=draw(st.integers(0, 5)))
        for i, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False))
    )
    upper = bounds[-1] if bounds else 0
    since = draw(st.integers(0, max(upper - 1, 0)))
    pending = tuple(
        ref(lo, lo + draw(st.integers(1, 100)), draw(st.integers(1, 50)), f"p{i}")
        for i, lo in enumerate(draw(st.lists(st.integers(upper, upper + 1000), max_size=3)))
    )
    return TraceState(
        relation_id=REL,
        since=since,
        upper=upper,
        batches=batches,
        pending=pending,
        wal_through=draw(st.integers(0, 2**64 - 1)),
        version=draw(st.integers(0, 10**6)),
    )


@settings(max_examples=200)
@given(states())
def test_round_trip(s):
    s.check_invariants()
    data = s.encode()
    back = TraceState.decode(data)
    assert back == s
    assert back.encode() == data
    doc = json.loads(data)
    assert doc["format"] == "sediment-trace-state" and doc["format_version"] == 1


@settings(max_examples=200)
@given(states(), st.data())
def test_moving_one_bound_breaks_an_invariant(s, data):
    if not s.batches:
        return
    i = data.draw(st.integers(0, len(s.batches) - 1))
    b = s.batches[i]
    which = data.draw(st.sampled_from(["lower", "upper"]))
    delta = data.draw(st.sampled_from([-1, 1]))
    moved = dataclasses.replace(b, **{which: getattr(b, which) + delta})
    if moved.key is not None:
        moved = dataclasses.replace(moved, key=batch_key(REL, max(moved.lower, 0), max(moved.upper, 0), "zz"))
    if which == "lower" and i == 0 and moved.lower >= 0 and moved.lower < moved.upper:
        return  # the first batch may start anywhere
    bad = dataclasses.replace(s, batches=(*s.batches[:i], moved, *s.batches[i + 1 :]))
    with pytest.raises((TraceInvariantViolation, TraceError)) as e:
        bad.check_invariants()
    assert f"relation {REL}" in str(e.value) or "batch key" in str(e.value)


def state(*batches: BatchRef, **kw) -> TraceState:
    upper = batches[-1].upper if batches else 0
    return TraceState(REL, batches=tuple(batches), upper=kw.pop("upper", upper), **kw)


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: state(ref(0, 5, nonce="a"), ref(6, 9, nonce="b")), "gap"),
        (lambda: state(ref(0, 5, nonce="a"), ref(4, 9, nonce="b")), "overlap"),
        (lambda: state(ref(0, 5), upper=6), "trace upper is 6"),
        (lambda: state(ref(0, 5), since=5), "since 5 is beyond the sealed frontier 4"),
        (lambda: state(since=1), "nothing is sealed"),
        (lambda: state(upper=3), "no batches"),
        (lambda: state(BatchRef(None, 0, 5, rows=3)), "claims 3 rows"),
        (lambda: state(BatchRef("x", 0, 5, 1)), "malformed key"),
        (lambda: state(ref(0, 5, rel=8)), "names relation 8"),
        (lambda: state(BatchRef(batch_key(REL, 0, 6, "a"), 0, 5, 1)), r"\[0, 6\)"),
        (lambda: state(ref(0, 5, nonce="a"), BatchRef(batch_key(REL, 0, 5, "b"), 5, 9, 1)), "names relation 9 "),
        (lambda: state(ref(0, 5), pending=(ref(4, 8, nonce="p"),)), "pending batch"),
        (lambda: state(ref(0, 5), pending=(ref(0, 5),)), "referenced twice"),
        (lambda: state(ref(0, 5), pending=(BatchRef(None, 6, 7),)), "no object key"),
        (lambda: state(BatchRef(None, 5, 5)), "lower 5 >= upper 5"),
        (lambda: state(ref(0, 5), version=-1), "version"),
    ],
)
def test_violations_name_relation_and_keys(make, match):
    with pytest.raises(TraceInvariantViolation, match=match) as e:
        make().check_invariants()
    assert f"relation {REL}" in str(e.value)


def test_violation_names_the_keys():
    a, b = ref(0, 5, nonce="aa"), ref(6, 9, nonce="bb")
    with pytest.raises(TraceInvariantViolation) as e:
        state(a, b).check_invariants()
    assert a.key in str(e.value) and b.key in str(e.value)


@pytest.mark.parametrize(
    "data,match",
    [
        (b"{not json", "not valid JSON"),
        (b"[]", "not a trace state"),
        (json.dumps({"format": "sediment-trace-state", "format_version": 2}).encode(), "format_version 2"),
        (json.dumps({"format": "sediment-trace-state", "format_version": 1, "relation_id": 1}).encode(), "since"),
    ],
)
def test_decode_rejects_malformed(data, match):
    with pytest.raises(TraceError, match=match):
        TraceState.decode(data)


def test_decode_checks_invariants():
    doc = json.loads(state(ref(0, 5)).encode())
    doc["upper"] = 7
    with pytest.raises(TraceInvariantViolation, match="upper is 7"):
        TraceState.decode(json.dumps(doc).encode())


def test_apply_merge():
    a, b, c = ref(0, 3, nonce="a"), BatchRef(None, 3, 4), ref(4, 9, nonce="c")
    s = state(a, b, c, since=2, version=4)
    merged = ref(0, 9, rows=2, nonce="m", level=1)
    t = s.apply_merge(0, 3, merged, inputs=[a, b, c])
    assert t.batches == (merged,) and t.version == 5 and t.upper == 9
    with pytest.raises(TraceInvariantViolation, match="does not cover"):
        s.apply_merge(0, 2, merged)
    with pytest.raises(TraceInvariantViolation, match="changed since planning"):
        s.apply_merge(0, 3, merged, inputs=[a, b])
    with pytest.raises(TraceInvariantViolation, match="out of range"):
        s.apply_merge(2, 5, merged)


def test_sealed_and_keys():
    s = state(ref(0, 5, nonce="a"), BatchRef(None, 5, 6), pending=(ref(7, 9, nonce="p"),))
    assert s.sealed == 5
    assert state().sealed is None
    assert s.keys() == [batch_key(REL, 0, 5, "a"), batch_key(REL, 7, 9, "p")]


def test_load_facts_are_kept_with_their_loads_and_older_documents_still_load():
    run = BatchRef(batch_key(1, 4, 8, "0f1e2d3c4b5a6978a1b2c3d4e5f60718"), 4, 8, 2, 10)
    s1 = TraceState(1).with_load([run], "job-a", keep=2, times=(4, 7))
    assert s1.load_result("job-a") == (2, 4, 7)
    back = TraceState.decode(s1.encode())
    assert back == s1 and back.load_result("job-a") == (2, 4, 7)
    s3 = s1.with_load([], "job-b", keep=2).with_load([], "job-c", keep=2)
    assert s3.loads == ("job-b", "job-c") and s3.load_result("job-a") is None  # forgotten with its name
    assert s3.load_result("job-b") == (0, None, None)
    doc = json.loads(s1.encode())
    del doc["load_facts"]  # a document written before facts were kept
    old = TraceState.decode(json.dumps(doc).encode())
    assert old.loads == ("job-a",) and old.load_result("job-a") is None


def test_malformed_load_facts_are_refused():
    doc = json.loads(TraceState(1).with_load([], "job-a", keep=2).encode())
    doc["load_facts"] = {"job-a": [1, "x", 2]}
    with pytest.raises(TraceError, match="load_facts"):
        TraceState.decode(json.dumps(doc).encode())


def test_load_facts_example_of_the_formats_doc_decodes():
    text = (Path(__file__).resolve().parents[2] / "docs" / "formats.md").read_text()
    block = text[text.index("Load facts example"):]
    block = block[block.index("```text") + 7:]
    state = TraceState.decode("".join(block[: block.index("```")].split("\n")).encode())
    assert state.loads == ("spark-1a2b", "spark-3c4d")
    assert state.load_result("spark-3c4d") == (2, 4, 7) and state.load_result("spark-1a2b") is None
