"""A relation's trace state (metadata key ``trace/<id>``) is written before its catalog entry
(engine/catalog.py ``create``), and the entry says so. A state missing under such an entry was
lost (deleted by hand, a damaged store): after a compaction trimmed the log, serving the relation
from the log alone would silently answer with only its newest rows. Open refuses with
MetadataCorruption naming the key, and verify reports it. An entry written before this mark
existed keeps opening without a state (a relation never compacted has none), and a crash between
the two writes of an add leaves a store that opens as if the add never happened."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pyarrow as pa
import pytest

import sediment
from sediment.engine.catalog import Catalog
from sediment.engine.verify_replicated import verify_engine
from sediment.errors import MetadataCorruption
from sediment.metadata import names
from sediment.metadata.journal import JournalMetadataStore

SCHEMA = pa.schema([("k", pa.int64())])
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _rows(*ks: int) -> pa.Table:
    return pa.table({"k": list(ks), "time": list(ks), "diff": [1] * len(ks)})


def _fill(e, name: str = "r") -> None:
    """``name`` added, rows 1..5 compacted (the log trimmed below them), then row 6 in the log only."""
    e.add_relation(name, SCHEMA)
    for t in range(1, 6):
        e.append(name, _rows(t))
        e.seal(name, t)
    e.compact()
    e.append(name, _rows(6))
    e.seal(name, 6)


def _keys(e, name: str = "r") -> list[int]:
    return sorted(e.snapshot(name, e.sealed(name)).column("k").to_pylist())


def _trace_key(meta, name: str = "r") -> str:
    return names.trace_key(Catalog(meta).get(name).id)


def test_a_trace_state_deleted_from_the_journal_store_is_refused_at_open_and_reported_by_verify(tmp_path):
    d = str(tmp_path / "d")
    with sediment.open(d) as e:
        _fill(e)
        assert _keys(e) == [1, 2, 3, 4, 5, 6]
    meta = JournalMetadataStore(os.path.join(d, "meta"))
    key = _trace_key(meta)
    meta.delete(key)  # what a user with the store open in Python (or a lost write) does
    meta.close()
    for _ in range(2):  # refused, and the refusal created nothing: refused again
        with pytest.raises(MetadataCorruption, match=key):
            sediment.open(d)
    meta = JournalMetadataStore(os.path.join(d, "meta"))
    assert meta.get(key) is None
    meta.close()
    report = verify_engine(d)
    assert not report.ok and any(key in p and "'r'" in p for p in report.problems), report.problems


@pytest.mark.s3
def test_trace_state_objects_deleted_from_s3_metadata_are_refused_at_open_and_reported_by_verify(
        tmp_path, s3_bucket, moto_server):
    endpoint, bucket = s3_bucket
    opts = {"wal": f"s3://{bucket}/wal", "metadata": f"s3://{bucket}/meta?endpoint={endpoint}",
            "blob": f"s3://{bucket}/blobs", "s3_endpoint": endpoint, "compact_interval": 3600.0}
    d = str(tmp_path / "a")
    with sediment.open(d, **opts) as e:
        _fill(e)
        key = names.trace_key(e.view.relations["r"].entry.id)
    client = moto_server.client()
    gone = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="meta/trace/")
            for o in page.get("Contents", ())]
    assert gone
    for k in gone:
        client.delete_object(Bucket=bucket, Key=k)
    for where in (d, str(tmp_path / "b")):  # this data directory, and a new coordinator's (a take-over)
        with pytest.raises(MetadataCorruption, match=key):
            sediment.open(where, metadata=opts["metadata"])
    assert not client.list_objects_v2(Bucket=bucket, Prefix="meta/trace/").get("Contents"), "not recreated empty"
    report = verify_engine(d)
    assert not report.ok and any(key in p for p in report.problems), report.problems


def test_a_relation_never_compacted_opens_after_others_trimmed_the_log_old_entries_included(tmp_path):
    """No false alarm: "new" (added now, with its empty state) and "old" (an entry as the
    previous format wrote it, with no trace state) are never compacted while "r" trims the log."""
    d = str(tmp_path / "d")
    with sediment.open(d) as e:
        e.add_relation("new", SCHEMA)
    meta = JournalMetadataStore(os.path.join(d, "meta"))
    old = Catalog(meta).create("old", SCHEMA)  # no trace state first: an entry of the previous format
    assert not old.traced and b"trace_state" not in meta.get(names.relation_key("old")).value
    meta.close()
    with sediment.open(d) as e:
        _fill(e)
        assert e.wal.start_lsn > 0, "the log was trimmed past the adds"
    with sediment.open(d) as e:
        assert _keys(e) == [1, 2, 3, 4, 5, 6] and e.sealed("new") == e.sealed("old") == -1
        for name in ("new", "old"):
            e.append(name, _rows(7))
            e.seal(name, 7)
            assert _keys(e, name) == [7]
    assert verify_engine(d).ok


def _kill_between_the_two_writes_of_an_add(d: str, name: str = "b") -> str:
    """A real process adds ``name`` and is SIGKILLed right after the trace state's write,
    before the catalog entry's. Returns the trace state's key."""
    code = textwrap.dedent(f"""
        import os, signal
        import pyarrow as pa
        import sediment
        from sediment.trace.store import TraceStore
        real = TraceStore.create
        def create(self, rid):
            real(self, rid)
            os.kill(os.getpid(), signal.SIGKILL)
        TraceStore.create = create
        e = sediment.open({d!r})
        e.add_relation({name!r}, pa.schema([("k", pa.int64())]))
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, timeout=120, capture_output=True)
    assert proc.returncode == -9, proc.stderr.decode()
    meta = JournalMetadataStore(os.path.join(d, "meta"))
    try:
        assert meta.get(names.relation_key(name)) is None, "killed between the two writes"
        named = {Catalog(meta).get(n).id for n in (k[len(names.RELATIONS):] for k in meta.list(names.RELATIONS))}
        unused = [k for k in meta.list(names.TRACES) if names.trace_relation_id(k) not in named]
    finally:
        meta.close()
    assert len(unused) == 1
    return unused[0]


def test_a_crash_between_the_trace_state_and_the_catalog_entry_of_an_add_leaves_it_not_added(tmp_path):
    """A real process SIGKILLed right after the new relation's trace state was written, before
    its catalog entry: the next open serves what was there, without the relation; the name can
    be added again (under a new id) and verify finds nothing wrong."""
    d = str(tmp_path / "d")
    with sediment.open(d) as e:
        _fill(e)
    _kill_between_the_two_writes_of_an_add(d)
    with sediment.open(d) as e:
        assert e.relations() == ["r"] and _keys(e) == [1, 2, 3, 4, 5, 6]
        e.add_relation("b", SCHEMA)
        e.append("b", _rows(1))
        e.seal("b", 1)
    with sediment.open(d) as e:
        assert _keys(e, "b") == [1]
    assert verify_engine(d).ok


def test_verify_notes_an_unused_trace_state_and_repair_deletes_it_only_when_empty(tmp_path, capsys):
    """The state a kill between the two writes of an add leaves is noted by verify (not a
    problem: the engine opens) and deleted by ``verify --repair``; an unused state that names
    batches (here a compacted relation's whose catalog entry alone was deleted, as a drop
    stopped between its two deletes leaves it) is reported and kept. Relations in use are
    untouched."""
    from sediment.cli import main
    from sediment.trace.state import TraceState

    d = str(tmp_path / "d")
    with sediment.open(d) as e:
        _fill(e)
        _fill(e, "s")
    empty = _kill_between_the_two_writes_of_an_add(d)
    meta = JournalMetadataStore(os.path.join(d, "meta"))
    used, full = _trace_key(meta), _trace_key(meta, "s")
    full_state, used_state = (TraceState.decode(meta.get(k).value) for k in (full, used))
    assert full_state.batches
    meta.delete(names.relation_key("s"))
    meta.close()
    report = verify_engine(d)
    assert report.ok, report.problems
    notes = [n for n in report.notes if "unused trace state" in n]
    assert len(notes) == 2 and empty in notes[0] + notes[1] and full in notes[0] + notes[1], report.notes
    capsys.readouterr()
    assert main(["--data-dir", d, "verify", "--repair"]) == 0
    out = capsys.readouterr().out
    assert f"repaired: deleted {empty}" in out and f"repaired: kept: metadata key {full!r}" in out, out
    meta = JournalMetadataStore(os.path.join(d, "meta"))
    try:
        assert meta.get(empty) is None
        assert TraceState.decode(meta.get(full).value) == full_state
        assert TraceState.decode(meta.get(used).value) == used_state
    finally:
        meta.close()
    after = verify_engine(d)
    assert after.ok and not any(empty in n for n in after.notes) and any(full in n for n in after.notes)
    with sediment.open(d) as e:
        assert e.relations() == ["r"] and _keys(e) == [1, 2, 3, 4, 5, 6]
