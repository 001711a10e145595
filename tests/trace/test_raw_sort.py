"""Raw runs read and merged in bounded memory (trace/raw_sort.py): a raw run larger than the
reader's budget is consolidated a piece at a time, spilled and merged, with peak allocation
(pyarrow's pool, measured in a fresh process) under the bound plus a stated slack, and the
rows equal to consolidating the whole file at once (the route every read took before)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sediment.blob.file import FileBlobStore
from sediment.metadata.memory import MemoryMetadataStore
from sediment.trace.batch import RAW_VERSION, BatchDescription, batch_key, file_checksums
from sediment.trace.raw import raw_run
from sediment.trace.raw_sort import WORK_FACTOR, budget_rows, sorted_raw
from sediment.trace.state import BatchRef
from sediment.trace.store import TraceStore

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string()), ("time", pa.int64()), ("diff", pa.int64())])
ROWS = 400_000
BOUND = 8 << 20
SLACK = 8 << 20  # past the bound, whatever it is: the Parquet reader's decoded pages and dictionary


def frame(keys: list[int]) -> pa.Table:
    """As Spark writes a frame: its own column order, not null, no time or diff."""
    return pa.table({"v": pa.array([f"{k:016x}" for k in keys]), "k": pa.array(keys, pa.int64())})


def put_raw(blobs: FileBlobStore, table: pa.Table, nonce: str, tmp) -> BatchRef:
    """``table`` as one raw run of one row group (as Spark writes a partition), time 6, diff 1."""
    desc = BatchDescription(1, 6, 7, 3, table.num_rows, format_version=RAW_VERSION, time=6, diff=1)
    path = str(tmp / f"{nonce}.parquet")
    pq.write_table(table.replace_schema_metadata(desc.to_metadata()), path, row_group_size=1 << 24,
                   compression="snappy")
    crc, footer_crc = file_checksums(path)
    key = batch_key(1, 6, 7, nonce)
    blobs.put_file(key, path)
    return BatchRef(key, 6, 7, table.num_rows, os.path.getsize(blobs.local_path(key)), 0, 3, None, None, crc,
                    footer_crc, True, 6, 1)


def whole(table: pa.Table) -> pa.Table:
    """The whole file consolidated at once, as reads did before."""
    return raw_run(table, BatchDescription(1, 6, 7, 3, table.num_rows, format_version=RAW_VERSION, time=6, diff=1),
                   SCHEMA)


MEASURE = textwrap.dedent("""
    import json, sys
    import pyarrow as pa
    from sediment.blob.file import FileBlobStore
    from sediment.metadata.memory import MemoryMetadataStore
    from sediment.trace.state import BatchRef, TraceState
    from sediment.trace.store import TraceStore
    root, ref, bound, op = sys.argv[1], BatchRef(**json.loads(sys.argv[2])), int(sys.argv[3]), sys.argv[4]
    store = TraceStore(MemoryMetadataStore(), FileBlobStore(root))
    store.set_schema(1, pa.schema([("k", pa.int64()), ("v", pa.string()), ("time", pa.int64()),
                                   ("diff", pa.int64())]))
    store.memory_bound = bound
    pool = pa.default_memory_pool()
    base = pool.bytes_allocated()
    out = {}
    if op == "merge":  # as the merge task calls it: one raw run, chunks from the same bound
        out["ref"] = store.merge(1, [ref], ["k", "v"], store.schema_of(1), ref.since, 1,
                                 chunk_rows=max(1024, bound // (4 * 64)), span=(ref.lower, ref.upper)).to_json()
    elif op == "verify":  # every row as stored, page checksums checked
        out["problems"] = store.verify(TraceState(1, upper=0, pending=(ref,)))
    else:
        out["rows"] = sum(t.num_rows for t in store.read_stream(1, ref))
    out["peak"] = pool.max_memory() - base
    print(json.dumps(out))
""")


def measured(root: str, ref: BatchRef, op: str, cwd) -> dict:
    got = subprocess.run([sys.executable, "-c", MEASURE, root, json.dumps(ref.to_json()), str(BOUND), op],
                         capture_output=True, text=True, timeout=300, cwd=cwd, check=True)
    return json.loads(got.stdout)


@pytest.fixture
def store(tmp_path) -> TraceStore:
    s = TraceStore(MemoryMetadataStore(), FileBlobStore(str(tmp_path / "blobs")))
    s.set_schema(1, SCHEMA)
    s.memory_bound = BOUND
    return s


def test_a_raw_run_past_the_bound_is_merged_and_read_within_it(store, tmp_path):
    """400k shuffled rows, half of them repeats, in one row group (Spark's shape): about 7 MB of
    decoded rows, which consolidating whole peaked at 50 MB
against an 8 MB bound. The merge task's merge, a
    streamed read and verify (the rows as stored) keep to the bound; whole reads, replay's pieces and the merge all give the
    rows consolidating the whole file gives; no spill file is left behind."""
    rng = random.Random(27)
    keys = [rng.randrange(ROWS // 2) for _ in range(ROWS)]
    table = frame(keys)
    ref = put_raw(store.blobs, table, "big", tmp_path)
    assert budget_rows(pq.ParquetFile(store.blobs.local_path(ref.key)), BOUND, "w") < ROWS // 4  # four pieces or more
    want = whole(table)
    assert want.num_rows < ROWS and max(want.column("diff").to_pylist()) > 1  # repeats were summed
    root = str(tmp_path / "blobs")
    merged = measured(root, ref, "merge", tmp_path)
    streamed = measured(root, ref, "stream", tmp_path)
    verified = measured(root, ref, "verify", tmp_path)
    assert streamed["rows"] == want.num_rows and verified["problems"] == []
    for peak in (merged["peak"], streamed["peak"], verified["peak"]):
        assert peak <= BOUND + SLACK, f"peak allocation {peak} past the bound {BOUND} + {SLACK}"
    out = BatchRef(**merged["ref"])
    assert not out.raw and store.read(1, out).equals(want)
    assert store.read(1, ref).equals(want)
    assert pa.concat_tables(list(store.read_pieces(1, ref))).equals(want)
    assert not [f for f in os.listdir(root) if f.startswith("spill-")]


def test_an_ordered_raw_run_past_the_bound_streams_without_spilling(tmp_path):
    """A frame written in key order (fresh ids) is consolidated piece by piece and handed out
    in order: nothing is spilled. A shuffled one spills, and both equal the whole fold."""
    desc = BatchDescription(1, 6, 7, 3, 50_000, format_version=RAW_VERSION, time=6, diff=-1)
    for keys, spills in ((list(range(50_000)), 0), (random.Random(3).sample(range(50_000), 50_000), 5)):
        path = str(tmp_path / "f.parquet")
        pq.write_table(frame(keys), path, row_group_size=1 << 24)
        made = []

        def spill(made=made) -> str:
            made.append(str(tmp_path / f"spill-{len(made)}.parquet"))
            return made[-1]

        pf = pq.ParquetFile(path)
        assert budget_rows(pf, 1 << 20, "w") < 10_000  # five pieces or more
        got = pa.concat_tables(sorted_raw(pf, desc, SCHEMA, memory=1 << 20, spill=spill, where="w"))
        assert got.equals(raw_run(pq.read_table(path), desc, SCHEMA))
        assert len(made) >= spills and (spills or not made)
        assert not [p for p in made if os.path.exists(p)]


def test_pieces_that_cancel_each_other_out_leave_no_run_behind(tmp_path):
    """A changelog load past the bound: its first eight pieces insert and then retract the
    same keys, so their merge is empty; the ninth holds other rows. The read gives those rows
    (it raised FileNotFoundError on a spill file never written, on every read)."""
    n = 1024
    keys = list(range(4 * n)) * 2 + list(range(100_000, 100_000 + n))
    diffs = [1] * (4 * n) + [-1] * (4 * n) + [1] * n
    path = str(tmp_path / "raw.parquet")
    pq.write_table(frame(keys).append_column("diff", pa.array(diffs, pa.int64())), path, row_group_size=1 << 24)
    desc = BatchDescription(1, 6, 7, 3, len(keys), format_version=RAW_VERSION, time=6, diff=None)
    pf = pq.ParquetFile(path)
    assert budget_rows(pf, 1, "w") == n  # nine pieces: two rounds of merging, the first one empty
    made: list[str] = []

    def spill() -> str:
        made.append(str(tmp_path / f"spill-{len(made)}.parquet"))
        return made[-1]

    want = raw_run(pq.read_table(path), desc, SCHEMA)
    assert want.column("k").to_pylist() == list(range(100_000, 100_000 + n))
    assert pa.concat_tables(sorted_raw(pf, desc, SCHEMA, memory=1, spill=spill, where="w")).equals(want)
    assert not [p for p in made if os.path.exists(p)]


def test_the_budget_counts_decoded_values_not_dictionary_codes(tmp_path):
    """A column of a few long strings is stored as dictionary codes: the footer says about 9
    bytes a row, decoded it is over 200. The budget follows the decoded size (it followed the
    footer and held 5x the bound)."""
    rows = 50_000
    names = [f"v{i % 10}" * 60 for i in range(rows)]
    path = str(tmp_path / "dict.parquet")
    pq.write_table(pa.table({"k": pa.array(range(rows), pa.int64()), "name": pa.array(names)}), path,
                   row_group_size=1 << 24)
    pf = pq.ParquetFile(path)
    footer_per_row = pf.metadata.row_group(0).total_byte_size / rows
    decoded_per_row = pq.read_table(path).nbytes / rows
    assert decoded_per_row > 5 * footer_per_row
    memory = 64 << 20
    assert budget_rows(pf, memory, "w") * WORK_FACTOR * decoded_per_row <= memory


def test_spills_of_a_store_without_local_files_are_swept_at_the_next_open(tmp_path):
    """A store whose blobs are not local files (S3) spills under the engine's data directory;
    what a killed process left there is deleted when the engine opens again."""
    import sediment
    from sediment.trace.store import SPILL_PREFIX

    data = tmp_path / "data"
    with sediment.open(str(data), blob="memory://", compact_interval=None) as eng:
        left = os.path.join(eng.traces.spill_dir, SPILL_PREFIX + "killed.parquet")
        os.makedirs(eng.traces.spill_dir, exist_ok=True)
        with open(left, "wb") as f:
            f.write(b"a sorted piece of a process that was killed")
        assert eng.traces.spill_dir.startswith(str(data))
    with sediment.open(str(data), blob="memory://", compact_interval=None):
        assert not os.path.exists(left)
