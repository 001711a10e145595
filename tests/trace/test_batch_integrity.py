"""Issue 12 finding 5: a batch is checked whole. Every byte of a stored batch's footer is
flipped in turn; each flip must end in BatchCorruption naming the key on every read path
(snapshot, replay, the row-group reader Spark uses), and `sediment verify` must exit 1
naming the key. The trace state records each batch's length, whole-object and footer
CRC32C; old states without them still load."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pytest

import sediment
from sediment.cli import main as cli_main
from sediment.engine.verify import verify_data_dir
from sediment.errors import BatchCorruption
from sediment.trace.batch import BatchDescription, encode_batch, open_stored, read_row_group
from sediment.trace.state import BatchRef, TraceState
from sediment.trace.store import TraceStore, describe

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])


def _updates(n: int, t: int) -> pa.Table:
    return pa.table({"k": list(range(n)), "v": [f"v{i}" for i in range(n)],
                     "time": [t] * n, "diff": [1] * n})


def _engine_with_batch(path) -> tuple[str, BatchRef]:
    """A data directory with one relation whose one batch holds 50 rows."""
    with sediment.open(str(path), compact_interval=None) as e:
        e.add_relation("r", SCHEMA)
        e.append("r", _updates(50, 1))
        e.seal("r", 1)
        e.compact()
        ref = next(b for b in e.view.relations["r"].trace.batches if b.key)
        assert e.snapshot("r", 1).num_rows == 50
    return str(path), ref


def _footer_span(data: bytes) -> range:
    flen = int.from_bytes(data[-8:-4], "little")
    return range(len(data) - flen - 8, len(data))


def test_state_records_length_and_checksums_and_old_states_load(tmp_path):
    _data, ref = _engine_with_batch(tmp_path / "d")
    assert ref.bytes > 0 and isinstance(ref.crc, int) and isinstance(ref.footer_crc, int)
    state = TraceState(7, upper=2, batches=(BatchRef(ref.key.replace(ref.key.split("/")[1], f"{7:016x}"),
                                                     ref.lower, ref.upper, 3, 10, crc=5, footer_crc=6),))
    assert TraceState.decode(state.encode()) == state
    old = json.loads(state.encode())
    for b in old["batches"]:
        del b["crc"], b["footer_crc"]
    decoded = TraceState.decode(json.dumps(old).encode())
    assert decoded.batches[0].crc is None and decoded.batches[0].footer_crc is None
    assert b'"crc"' not in decoded.encode()  # an old document keeps its bytes when re-encoded


def _flip(path: str, pos: int) -> bytes:
    with open(path, "r+b") as f:
        f.seek(pos)
        old = f.read(1)
        f.seek(pos)
        f.write(bytes([old[0] ^ 0x01]))
    return old


def _restore(path: str, pos: int, old: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(old)


def test_every_footer_bit_flip_is_batch_corruption_on_every_read_path(tmp_path):
    data_dir, ref = _engine_with_batch(tmp_path / "d")
    obj = os.path.join(data_dir, "blobs", ref.key)
    with open(obj, "rb") as f:
        original = f.read()
    span = _footer_span(original)
    assert len(span) > 100
    with sediment.open(data_dir, compact_interval=None) as e:
        blobs = e.traces.blobs
        rid = e.view.relations["r"].entry.id
        for pos in span:
            old = _flip(obj, pos)
            for read in (lambda: e.snapshot("r", 1), lambda: list(e.replay("r")),
                         lambda: open_stored(blobs, ref.key, describe(rid, ref), expected_bytes=ref.bytes,
                                             footer_crc=ref.footer_crc)):
                with pytest.raises(BatchCorruption) as info:
                    read()
                assert ref.key in str(info.value), pos
            _restore(obj, pos, old)
        assert e.snapshot("r", 1).num_rows == 50


@pytest.mark.parametrize("where", ["footer", "middle", "magic"])
def test_verify_exits_1_naming_the_key(tmp_path, capsys, where):
    data_dir, ref = _engine_with_batch(tmp_path / "d")
    obj = os.path.join(data_dir, "blobs", ref.key)
    with open(obj, "rb") as f:
        data = f.read()
    pos = {"footer": _footer_span(data)[len(_footer_span(data)) // 2], "middle": len(data) // 2,
           "magic": len(data) - 1}[where]
    assert verify_data_dir(data_dir).ok
    _flip(obj, pos)
    report = verify_data_dir(data_dir)
    assert not report.ok and any(ref.key in p for p in report.problems)
    assert cli_main(["verify", "--data-dir", data_dir]) == 1
    assert ref.key in capsys.readouterr().out


def test_schema_is_checked_against_the_catalog(tmp_path):
    """A batch whose footer is intact but whose schema is not the relation's (written by
    a bug, or swapped in) is refused on read and by verify."""
    data_dir, ref = _engine_with_batch(tmp_path / "d")
    obj = os.path.join(data_dir, "blobs", ref.key)
    wrong = pa.table({"k": pa.array(range(50), pa.int32()), "v": [f"v{i}" for i in range(50)],
                      "time": [1] * 50, "diff": [1] * 50})
    rid = int(ref.key.split("/")[1], 16)
    data = encode_batch(wrong, BatchDescription(rid, ref.lower, ref.upper, ref.since, 50, ref.wal_first,
                                                ref.wal_last, ref.level))
    with open(obj, "wb") as f:
        f.write(data)
    store = TraceStore(None, sediment.blob.file.FileBlobStore(os.path.join(data_dir, "blobs")))  # type: ignore[arg-type]
    store.set_schema(rid, pa.schema([*SCHEMA, ("time", pa.int64()), ("diff", pa.int64())]))
    unchecked = BatchRef(ref.key, ref.lower, ref.upper, 50, len(data), ref.level, ref.since, ref.wal_first,
                         ref.wal_last)  # an old state without checksums: only the schema check can tell
    with pytest.raises(BatchCorruption, match="update schema"):
        list(store.read_stream(rid, unchecked))
    with pytest.raises(BatchCorruption, match="update schema"):
        store.read(rid, unchecked)
    report = verify_data_dir(data_dir)
    assert not report.ok and any(ref.key in p for p in report.problems)


def test_truncated_and_garbage_tails_are_batch_corruption(tmp_path):
    data_dir, ref = _engine_with_batch(tmp_path / "d")
    obj = os.path.join(data_dir, "blobs", ref.key)
    with open(obj, "rb") as f:
        original = f.read()
    blobs = sediment.blob.file.FileBlobStore(os.path.join(data_dir, "blobs"))
    rid = int(ref.key.split("/")[1], 16)
    for damaged in (original[:-1], original[:-9], original + b"\0" * 7, original[:100], b"",
                    original[:-8] + (10**6).to_bytes(4, "little") + b"PAR1"):
        with open(obj, "wb") as f:
            f.write(damaged)
        for size in (None, len(damaged)):
            with pytest.raises(BatchCorruption) as info:
                pf, desc = open_stored(blobs, ref.key, describe(rid, ref), expected_bytes=size,
                                       footer_crc=ref.footer_crc)
                for i in range(pf.num_row_groups):
                    read_row_group(pf, i, desc)
            assert ref.key in str(info.value)
    blobs.close()


def test_spark_executor_reader_refuses_a_damaged_footer(tmp_path):
    """The executor-side reader of a read plan (spark_jobs.batch_read.open_batch) checks
    the footer CRC32C the plan carries, without Spark in the loop."""
    pytest.importorskip("pyspark")
    from sediment.spark_jobs.batch_read import PlanInfo, ReadSpec, open_batch

    def rows(spec: ReadSpec, ref: dict) -> int:
        pf, desc, where = open_batch(spec, ref)
        return sum(read_row_group(pf, i, desc, where=where).num_rows for i in range(pf.num_row_groups))

    data_dir, ref = _engine_with_batch(tmp_path / "d")
    obj = os.path.join(data_dir, "blobs", ref.key)
    with sediment.open(data_dir, compact_interval=None) as e:
        plan = e.plan_read("r", 1)
        try:
            spec = ReadSpec.of(PlanInfo.of(plan, None))
            (batch,) = plan.batches
            assert rows(spec, batch) == 50
            with open(obj, "rb") as f:
                data = f.read()
            span = _footer_span(data)
            for pos in (span[0], span[len(span) // 2], span[-9]):
                old = _flip(obj, pos)
                with pytest.raises(BatchCorruption, match=ref.key):
                    rows(spec, batch)
                _restore(obj, pos, old)
        finally:
            e.release_read(plan.lease)


def test_flips_in_pages_never_give_a_wrong_answer_or_an_untyped_error(tmp_path):
    """Outside the footer, the row-group stream (``read_stream``: merges, and replay from a
    remote store, which never fetches an object whole) relies on page CRCs and decoding; page
    headers are not covered, so a flip there must still end typed or change nothing read.
    Reads that check the object's CRC32C first (snapshot, and replay in either order from
    local files) refuse every flip."""
    data_dir, ref = _engine_with_batch(tmp_path / "d")
    obj = os.path.join(data_dir, "blobs", ref.key)
    with open(obj, "rb") as f:
        original = f.read()
    outcomes: dict[str, int] = {}
    with sediment.open(data_dir, compact_interval=None) as e:
        rid = e.view.relations["r"].entry.id
        good = pa.concat_tables(list(e.traces.read_stream(rid, ref)))
        for pos in range(4, _footer_span(original)[0], 2):
            old = _flip(obj, pos)
            try:
                got = pa.concat_tables(list(e.traces.read_stream(rid, ref)))
                outcome = "same data" if got.equals(good) else "wrong answer"
            except BatchCorruption as exc:
                assert ref.key in str(exc)
                outcome = "typed error"
            for read in (lambda: e.snapshot("r", 1), lambda: list(e.replay("r")),
                         lambda: list(e.replay("r", ordered=False))):
                with pytest.raises(BatchCorruption, match="CRC32C"):
                    read()
            _restore(obj, pos, old)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert set(outcomes) <= {"same data", "typed error"} and outcomes["typed error"] > outcomes.get("same data", 0)


def test_a_whole_batch_read_refuses_missing_truncated_or_flipped_objects_typed(tmp_path):
    """A snapshot's whole-batch read (TraceStore.read: the object's CRC32C streamed from the open file,
    then decoded from that same file): a deleted object is "missing", a short one is refused by
    its size, a flipped byte by its CRC, each a BatchCorruption naming the key; a whole one reads."""
    data_dir, ref = _engine_with_batch(tmp_path / "d")
    obj = os.path.join(data_dir, "blobs", ref.key)
    with open(obj, "rb") as f:
        original = f.read()
    eng = sediment.open(data_dir, compact_interval=None)
    try:
        assert eng.snapshot("r", 1).num_rows == 50
        middle = len(original) // 2
        cases = {"missing from the blob store": None, "bytes but the trace state says": original[:-1],
                 "CRC32C": original[:middle] + bytes([original[middle] ^ 1]) + original[middle + 1:]}
        for expected, damaged in cases.items():
            if damaged is None:
                os.remove(obj)
            else:
                with open(obj, "wb") as f:
                    f.write(damaged)
            with pytest.raises(BatchCorruption) as info:
                eng.snapshot("r", 1)
            assert ref.key in str(info.value) and expected in str(info.value)
        with open(obj, "wb") as f:
            f.write(original)
        assert eng.snapshot("r", 1).num_rows == 50
    finally:
        eng.close()


def test_checksums_of_a_batch_whose_footer_exceeds_the_tail_prefetch(tmp_path):
    """A footer longer than the 64 KiB first fetch (many row groups' statistics): the in-memory
    and the streamed checksums agree, and neither copies nor misreads it."""
    from sediment.trace.batch_checksum import TAIL_PREFETCH, checksums, file_checksums

    n = 200_000
    table = pa.table({"k": pa.array(range(n), pa.int64()), "v": [f"v{i:07d}" for i in range(n)],
                      "time": pa.array([1] * n, pa.int64()), "diff": pa.array([1] * n, pa.int64())})
    import pyarrow.parquet as pq

    path = str(tmp_path / "big-footer.parquet")
    pq.write_table(table, path, row_group_size=200)  # 1,000 row groups
    with open(path, "rb") as f:
        data = f.read()
    assert int.from_bytes(data[-8:-4], "little") > TAIL_PREFETCH
    in_memory = checksums(data)
    assert file_checksums(path) == in_memory == checksums(memoryview(data))
    with pa.OSFile(path) as f:
        assert file_checksums(f) == in_memory
