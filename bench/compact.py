"""Compaction throughput and merge memory of sediment, beside pyarrow's own kernels, in one run.

Why: the targets are relative (compaction >= 60% of what pyarrow's kernels do with the
same rows; a merge of a trace several times the memory bound stays within the bound
+ 200 MB), and this machine is shared and noisy, so the limit is measured in the same
run, with the same rows, in alternating rounds; each figure is the best of its rounds.

Part A, WAL -> batch: N rows of ``k int64, v binary (16 B, a function of k)`` plus
``time`` (a few hundred timestamps) and ``diff``, ~10% of them repeating an earlier
(k, v, time) with diff +1 or -1, appended (in 100k-row appends) to an engine opened
with ``compact=False`` and a 4 GiB segment, sealed, then ``engine.compact()`` timed.
Phase timers (wrappers installed on the engine instance in this process only) split it
into WAL read + IPC decode, concat/filter, consolidate (sort + run sums), Parquet encode,
blob put (fsync), commit, and the merge step. The limit is pyarrow alone on the same
in-memory table: ``sort_by([k, v, time])`` + ``group_by([k, v, time], use_threads=False)
.aggregate([(diff, sum)])`` + zero filter + ``pq.write_table`` (zstd, 64Ki-row groups,
page checksums: the engine's format) to a file + fsync.

Part B, merge: K sorted, consolidated batches (adjacent time ranges, interleaved keys)
written with ``TraceStore.write`` into a ``FileBlobStore``; then, each in its own
subprocess (peak RSS = the child's VmHWM read from /proc/self/status at its end):
``TraceStore.merge`` with the engine's chunk sizing for ``--memory-bound``; for
reference, an unbounded in-memory merge (``pq.read_table`` all, concat, sort_by,
write) and a streaming copy (read every row group, write them out: the I/O floor).

    .venv/bin/python bench/compact.py            # about 1.5-2 min: 3 rounds of 4M rows; merge of ~10M rows
    .venv/bin/python bench/compact.py --quick    # about 25-30 s
    .venv/bin/python bench/compact.py --profile  # also cProfile one compact() and print the top entries
    .venv/bin/python bench/compact.py --json out.json
    .venv/bin/python bench/compact.py --only c   # part C: 12 x 1M rows, unsealed vs sealed, per-pass times

Temp directories go under ``--dir`` (default /tmp) and are removed afterwards.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import shutil
import subprocess
import sys
import tempfile
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import sediment
from sediment.trace.batch import DEFAULT_ROW_GROUP_ROWS
from sediment.trace.consolidate import consolidate
from sediment.trace.parquet_layout import COMPRESSION

MiB = 1 << 20
SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.binary())])
KEYS = ["k", "v"]
UPDATE_SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.binary()), ("time", pa.int64()), ("diff", pa.int64())])
GOLDEN = 0x9E3779B97F4A7C15


# --- data ------------------------------------------------------------------------------------


def _arange(n: int, start: int = 0) -> pa.Array:
    ones = pa.nulls(n, pa.int64()).fill_null(1)
    return pc.add(pc.subtract(pc.cumulative_sum(ones), 1), start)


def _rand_int(n: int, hi: int, lo: int = 0) -> pa.Array:
    return pc.add(pc.floor(pc.multiply(pc.random(n), hi - lo)).cast(pa.int64()), lo)


def _v_of(k: pa.Array) -> pa.Array:
    """16 bytes per row, a function of k: k's 8 bytes, then a multiplicative hash of k."""
    n = len(k)
    ku = k.cast(pa.uint64())
    h = pc.multiply(ku, pa.scalar(GOLDEN, pa.uint64()))  # wraps mod 2^64
    both = pa.concat_arrays([ku, h])
    j = _arange(2 * n)
    idx = pc.add(pc.divide(j, 2), pc.multiply(pc.bit_wise_and(j, 1), n))
    inter = both.take(idx)
    fsb = pa.FixedSizeBinaryArray.from_buffers(pa.binary(16), n, [None, inter.buffers()[1]])
    return fsb.cast(pa.binary())


def make_updates(rows: int, times: int, seed_keys: int | None = None, t0: int = 0) -> pa.Table:
    """``rows`` updates: 90% fresh (k random in [0, rows), diff 1), 10% repeating an earlier
    row's (k, v, time) with diff +1 or -1; times uniform in [t0, t0 + times)."""
    keys = seed_keys or rows
    base_n = rows - rows // 10
    k = _rand_int(base_n, keys)
    t = _rand_int(base_n, t0 + times, t0)
    dup_idx = _rand_int(rows - base_n, base_n)
    k = pa.concat_arrays([k, k.take(dup_idx)])
    t = pa.concat_arrays([t, t.take(dup_idx)])
    signs = pc.subtract(pc.multiply(_rand_int(rows - base_n, 2), 2), 1)
    diff = pa.concat_arrays([pa.nulls(base_n, pa.int64()).fill_null(1), signs])
    return pa.table({"k": k, "v": _v_of(k), "time": t, "diff": diff})


# --- helpers ---------------------------------------------------------------------------------


class Timers:
    def __init__(self) -> None:
        self.t: dict[str, float] = {}

    def wrap(self, name: str, fn):
        def inner(*a, **kw):
            s = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.t[name] = self.t.get(name, 0.0) + time.perf_counter() - s
        return inner


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def hwm_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def fmt_rate(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.0f}k"
    return f"{x:.0f}"


def status(ok: bool) -> str:
    return "met" if ok else "MISSED"


# --- part A: WAL -> batch --------------------------------------------------------------------


def build_engine(root: str, table: pa.Table, times: int, memory_bound: int):
    d = tempfile.mkdtemp(prefix="sed-compact-", dir=root)
    engine = sediment.open(d, compact=False, segment_bytes=4 << 30, memory_bound=memory_bound)
    engine.add_relation("r", SCHEMA)
    for piece in table.to_batches(max_chunksize=100_000):
        engine.append("r", pa.Table.from_batches([piece]))
    engine.seal("r", times - 1)
    return d, engine


def instrument(engine) -> Timers:
    """Phase timers on this engine instance and the module functions it calls (this process only)."""
    import sediment.engine.engine as eng_mod
    import sediment.trace.store as store_mod

    tm = Timers()
    log = engine.wal
    log.read = tm.wrap("wal read (pread+crc)", log.read)
    from sediment.engine.relation import Relation

    Relation.decode = tm.wrap("IPC decode", Relation.decode)
    engine.compaction.compact_relation = tm.wrap("_compact_relation (WAL->batch)", engine.compaction.compact_relation)
    engine.compaction.merge_relation = tm.wrap("_merge_relation (merges)", engine.compaction.merge_relation)
    engine.wal.finish_segment = tm.wrap("finish_segment", engine.wal.finish_segment)
    engine.traces.commit = tm.wrap("trace commit", engine.traces.commit)
    blobs = engine.traces.blobs
    blobs.put_if_absent = tm.wrap("blob put (write+fsync)", blobs.put_if_absent)
    orig_cons, orig_enc = eng_mod.consolidate, store_mod.encode_batch
    eng_mod.consolidate = tm.wrap("consolidate (sort+sums)", orig_cons)
    store_mod.encode_batch = tm.wrap("Parquet encode", orig_enc)

    def undo() -> None:
        eng_mod.consolidate, store_mod.encode_batch = orig_cons, orig_enc

    tm.undo = undo  # type: ignore[attr-defined]
    return tm


def run_engine_compact(root: str, table: pa.Table, times: int, memory_bound: int, profile: bool = False) -> dict:
    d, engine = build_engine(root, table, times, memory_bound)
    try:
        tm = instrument(engine)
        prof = cProfile.Profile() if profile else None
        try:
            t0 = time.perf_counter()
            if prof:
                prof.enable()
            engine.compact()
            if prof:
                prof.disable()
            total = time.perf_counter() - t0
        finally:
            tm.undo()  # type: ignore[attr-defined]
        info = engine.trace_info("r")
    finally:
        engine.close()
        shutil.rmtree(d, ignore_errors=True)
    merges = tm.t.get("_merge_relation (merges)", 0.0)
    out = {"total_s": total, "merge_s": merges, "wal_to_batch_s": total - merges, "phases": dict(tm.t),
           "rows_in": table.num_rows, "rows_out": info["rows"], "batches": info["batches"],
           "bytes": info["bytes"], "tail_records": info["tail_records"]}
    out["rows_s"] = table.num_rows / out["wal_to_batch_s"]
    if prof:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(28)
        out["profile_cum"] = s.getvalue()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(18)
        out["profile_tot"] = s.getvalue()
    return out


def run_kernel(root: str, table: pa.Table) -> dict:
    """pyarrow alone: sort, group_by sum, drop zeros, Parquet write (engine format) + fsync."""
    path = tempfile.mktemp(prefix="kernel-", suffix=".parquet", dir=root)
    try:
        ph = {}
        t0 = time.perf_counter()
        s = table.sort_by([("k", "ascending"), ("v", "ascending"), ("time", "ascending")])
        t1 = time.perf_counter()
        g = s.group_by(["k", "v", "time"], use_threads=False).aggregate([("diff", "sum")])
        g = g.rename_columns(["k", "v", "time", "diff"])
        g = g.filter(pc.not_equal(g.column("diff"), 0))
        t2 = time.perf_counter()
        with open(path, "wb") as f:
            pq.write_table(g, f, compression=COMPRESSION, row_group_size=DEFAULT_ROW_GROUP_ROWS,
                           write_page_checksum=True, write_statistics=True)
            t3 = time.perf_counter()
            f.flush()
            os.fsync(f.fileno())
        t4 = time.perf_counter()
        ph = {"sort_by": t1 - t0, "group_by sum + filter": t2 - t1, "Parquet write": t3 - t2, "fsync": t4 - t3}
        total = t4 - t0
        return {"total_s": total, "rows_s": table.num_rows / total, "phases": ph, "rows_out": g.num_rows,
                "bytes": os.path.getsize(path)}
    finally:
        if os.path.exists(path):
            os.unlink(path)


def run_consolidate_kernel(root: str, table: pa.Table) -> dict:
    """sediment's consolidate + the same Parquet write (how far the engine's own kernel is from pyarrow's)."""
    path = tempfile.mktemp(prefix="kernel2-", suffix=".parquet", dir=root)
    try:
        t0 = time.perf_counter()
        g = consolidate(table, KEYS, 0)
        t1 = time.perf_counter()
        with open(path, "wb") as f:
            pq.write_table(g, f, compression=COMPRESSION, row_group_size=DEFAULT_ROW_GROUP_ROWS,
                           write_page_checksum=True, write_statistics=True)
            f.flush()
            os.fsync(f.fileno())
        total = time.perf_counter() - t0
        return {"total_s": total, "rows_s": table.num_rows / total, "consolidate_s": t1 - t0, "rows_out": g.num_rows}
    finally:
        if os.path.exists(path):
            os.unlink(path)


def part_a(args) -> dict:
    table = make_updates(args.rows, args.times)
    print(f"\n== A. WAL -> batch: {args.rows:,} rows, {args.times} timestamps, {table.nbytes / 1e6:.0f} MB in memory, "
          f"{args.rounds} rounds (engine / pyarrow kernel / consolidate kernel alternating) ==", flush=True)
    rounds = []
    for r in range(args.rounds):
        e = run_engine_compact(args.dir, table, args.times, args.memory_bound)
        k = run_kernel(args.dir, table)
        c = run_consolidate_kernel(args.dir, table)
        rounds.append({"engine": e, "kernel": k, "consolidate_kernel": c})
        print(f"  round {r + 1}: engine WAL->batch {e['wal_to_batch_s']:.2f} s ({fmt_rate(e['rows_s'])} rows/s, "
              f"merges {e['merge_s']:.3f} s), pyarrow kernel {k['total_s']:.2f} s ({fmt_rate(k['rows_s'])} rows/s), "
              f"consolidate kernel {c['total_s']:.2f} s ({fmt_rate(c['rows_s'])} rows/s)", flush=True)
    best_e = min((x["engine"] for x in rounds), key=lambda x: x["wal_to_batch_s"])
    best_k = min((x["kernel"] for x in rounds), key=lambda x: x["total_s"])
    best_c = min((x["consolidate_kernel"] for x in rounds), key=lambda x: x["total_s"])
    if best_e["rows_out"] != best_k["rows_out"]:
        print(f"  WARNING: engine wrote {best_e['rows_out']} rows, kernel {best_k['rows_out']}")
    prof = None
    if args.profile:
        prof = run_engine_compact(args.dir, table, args.times, args.memory_bound, profile=True)
    ratio = best_e["rows_s"] / best_k["rows_s"]

    print("\n| case | seconds | rows/s | ratio to pyarrow kernel |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| sediment `compact()` WAL->batch (total minus merges) | {best_e['wal_to_batch_s']:.2f} | "
          f"{fmt_rate(best_e['rows_s'])} | {ratio:.2f}x |")
    print(f"| sediment `compact()` total (merges {best_e['merge_s']:.3f} s) | {best_e['total_s']:.2f} | "
          f"{fmt_rate(args.rows / best_e['total_s'])} | {best_k['total_s'] / best_e['total_s']:.2f}x |")
    print(f"| pyarrow kernel: sort_by + group_by sum + Parquet write + fsync | {best_k['total_s']:.2f} | "
          f"{fmt_rate(best_k['rows_s'])} | 1.00x |")
    print(f"| sediment `consolidate` + same Parquet write + fsync | {best_c['total_s']:.2f} | "
          f"{fmt_rate(best_c['rows_s'])} | {best_c['rows_s'] / best_k['rows_s']:.2f}x |")
    print(f"\nrows in {args.rows:,}, rows out {best_e['rows_out']:,} (kernel {best_k['rows_out']:,}); engine batch "
          f"{best_e['bytes'] / 1e6:.0f} MB in {best_e['batches']} batch(es), kernel file {best_k['bytes'] / 1e6:.0f} MB")
    print("\nengine phases (best round; nested: WAL read and IPC decode are inside _compact_relation):")
    print("| phase | seconds | share of WAL->batch |")
    print("| --- | ---: | ---: |")
    for name, s in sorted(best_e["phases"].items(), key=lambda kv: -kv[1]):
        print(f"| {name} | {s:.3f} | {s / best_e['wal_to_batch_s'] * 100:.0f}% |")
    inner = sum(best_e["phases"].get(n, 0) for n in ("wal read (pread+crc)", "IPC decode", "consolidate (sort+sums)",
                                                     "Parquet encode", "blob put (write+fsync)", "trace commit"))
    print(f"| (rest of _compact_relation: concat, min, filter below/above, to_pybytes copy...) | "
          f"{best_e['phases'].get('_compact_relation (WAL->batch)', 0) - inner:.3f} | |")
    print("\nkernel phases (best round):")
    print("| phase | seconds |")
    print("| --- | ---: |")
    for name, s in best_k["phases"].items():
        print(f"| {name} | {s:.3f} |")
    print(f"| sediment consolidate alone (consolidate kernel, best round) | {best_c['consolidate_s']:.3f} |")
    print("\n| target | ours | limit | ratio | need | status |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    print(f"| WAL->batch rows/s >= 60% of pyarrow kernel | {fmt_rate(best_e['rows_s'])} | {fmt_rate(best_k['rows_s'])} | "
          f"{ratio:.2f}x | 0.60x | {status(ratio >= 0.6)} |")
    if prof:
        print("\ncProfile of one compact() (cumulative, top):")
        print(prof["profile_cum"])
        print("cProfile (tottime, top):")
        print(prof["profile_tot"])
    return {"rounds": rounds, "best_engine": best_e, "best_kernel": best_k, "best_consolidate": best_c,
            "ratio": ratio, "met": ratio >= 0.6,
            "profile": None if prof is None else {k: prof[k] for k in ("profile_cum", "profile_tot")}}


# --- part B: merge memory --------------------------------------------------------------------


def chunk_rows_for(refs, memory_bound: int) -> int:
    """The engine's sizing (Engine._merge_relation)."""
    stored = sum(r.bytes for r in refs) or 1
    per_row = max(64, 8 * stored // max(1, sum(r.rows for r in refs)))
    return max(1024, memory_bound // (4 * len(refs) * per_row))


def build_merge_inputs(root: str, rows: int, inputs: int, times: int) -> tuple[str, list[dict], float]:
    from sediment.blob.file import FileBlobStore
    from sediment.metadata.memory import MemoryMetadataStore
    from sediment.trace.store import TraceStore

    blob_root = os.path.join(root, "blobs")
    store = TraceStore(MemoryMetadataStore(), FileBlobStore(blob_root))
    refs, arrow_bytes = [], 0
    per = rows // inputs
    for i in range(inputs):
        raw = make_updates(per, times, seed_keys=rows, t0=i * times)
        table = consolidate(raw, KEYS, 0)
        arrow_bytes += table.nbytes
        refs.append(store.write(1, table, i * times, (i + 1) * times, 0).to_json())
        del raw, table
    return blob_root, refs, arrow_bytes


def child_main(cfg_path: str) -> None:
    """Runs in a subprocess: one merge variant; prints one JSON line."""
    with open(cfg_path) as f:
        cfg = json.load(f)
    from sediment.blob.file import FileBlobStore
    from sediment.engine.memory import configure_memory_pool
    from sediment.metadata.memory import MemoryMetadataStore
    from sediment.trace import store as store_mod

    configure_memory_pool("system")  # as an engine process does (engine option arrow_memory_pool)
    from sediment.trace.merge import MergeStats
    from sediment.trace.state import BatchRef

    store = store_mod.TraceStore(MemoryMetadataStore(), FileBlobStore(cfg["blob_root"]), spill_dir=cfg["spill_dir"])
    refs = [BatchRef(**r) for r in cfg["refs"]]
    rows_in = sum(r.rows for r in refs)
    base = rss_mb()
    out: dict = {"mode": cfg["mode"], "rss_before_mb": base}
    t0 = time.perf_counter()
    if cfg["mode"] == "merge":
        stats = MergeStats()
        orig = store_mod.merge_to_batch

        def with_stats(*a, **kw):
            kw["stats"] = stats
            return orig(*a, **kw)

        store_mod.merge_to_batch = with_stats
        for name in cfg.get("patches") or []:
            _apply_patch(store_mod, store, name)
        ref = store.merge(1, refs, KEYS, UPDATE_SCHEMA, 0, 1, chunk_rows=cfg["chunk_rows"])
        out.update(rows_out=ref.rows, bytes_out=ref.bytes, rounds=stats.rounds, max_buffered_rows=stats.max_buffered_rows)
    elif cfg["mode"] == "in-memory":
        paths = [os.path.join(cfg["blob_root"], *r.key.split("/")) for r in refs]
        t = pa.concat_tables([pq.read_table(p) for p in paths])
        t = t.sort_by([("k", "ascending"), ("v", "ascending"), ("time", "ascending")])
        dst = os.path.join(cfg["spill_dir"], "inmem.parquet")
        pq.write_table(t, dst, compression=COMPRESSION, row_group_size=DEFAULT_ROW_GROUP_ROWS,
                       write_page_checksum=True)
        out.update(rows_out=t.num_rows, bytes_out=os.path.getsize(dst))
        os.unlink(dst)
    elif cfg["mode"] == "copy":
        dst = os.path.join(cfg["spill_dir"], "copy.parquet")
        n = 0
        with pq.ParquetWriter(dst, UPDATE_SCHEMA, compression=COMPRESSION, write_page_checksum=True) as w:
            for r in refs:
                pf = pq.ParquetFile(os.path.join(cfg["blob_root"], *r.key.split("/")))
                for i in range(pf.num_row_groups):
                    g = pf.read_row_group(i)
                    n += g.num_rows
                    w.write_table(g, row_group_size=DEFAULT_ROW_GROUP_ROWS)
        out.update(rows_out=n, bytes_out=os.path.getsize(dst))
        os.unlink(dst)
    out["seconds"] = time.perf_counter() - t0
    out["rows_s"] = rows_in / out["seconds"]
    out["peak_rss_mb"] = hwm_mb()
    print(json.dumps(out), flush=True)


def _apply_patch(store_mod, store, name: str) -> None:
    """Prototypes measured in the child only (never edits the engine): see the --patch option."""
    if name == "system_pool":
        # pyarrow's default pool here is mimalloc, which keeps freed pages; malloc returns them sooner.
        pa.set_memory_pool(pa.system_memory_pool())
        return
    if name == "put_file":
        # FileBlobStore has no put_file, so TraceStore.merge does f.read() of the whole spill file
        # and put_if_absent(bytes): the merged output sits in memory whole. Prototype: stream it.
        import shutil as _sh

        blobs = store.blobs

        def put_file(key, path, if_absent=True):
            dst = blobs._path(key)
            blobs._ensure_parent(dst, key)
            tmp = dst.with_name(dst.name + ".proto.tmp")
            with open(path, "rb") as src, open(tmp, "wb") as out:
                _sh.copyfileobj(src, out, 8 << 20)
                out.flush()
                os.fsync(out.fileno())
            os.link(tmp, dst)  # fails if it exists, like put_if_absent
            os.unlink(tmp)

        blobs.put_file = put_file


def run_child(cfg: dict, tmp: str) -> dict:
    cfg_path = os.path.join(tmp, f"cfg-{cfg['mode']}.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", cfg_path],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout = proc.stdout.read()
    stderr = proc.stderr.read()
    _pid, st, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(st)
    if proc.returncode != 0:
        raise RuntimeError(f"merge child {cfg['mode']} failed ({proc.returncode}): {stderr.decode()[-3000:]}")
    out = json.loads(stdout.decode().strip().splitlines()[-1])
    # wait4's ru_maxrss is kept in the JSON only: Linux carries the parent's pre-exec (forked) high-water
    # mark into the child's, so it overstates the child; VmHWM read inside the child is the figure used.
    out["ru_maxrss_mb_wait4"] = ru.ru_maxrss / 1024
    return out


def part_b(args) -> dict:
    from sediment.trace.state import BatchRef

    tmp = tempfile.mkdtemp(prefix="sed-merge-", dir=args.dir)
    try:
        t0 = time.perf_counter()
        blob_root, refs, arrow_bytes = build_merge_inputs(tmp, args.merge_rows, args.inputs, args.times)
        stored = sum(r["bytes"] for r in refs)
        chunk = chunk_rows_for([BatchRef(**r) for r in refs], args.memory_bound)
        stored_rows = sum(r["rows"] for r in refs)
        print(f"\n== B. merge: {args.inputs} batches, {stored_rows:,} rows ({args.merge_rows:,} generated), {arrow_bytes / 1e6:.0f} MB as Arrow, "
              f"{stored / 1e6:.0f} MB stored; memory bound {args.memory_bound / MiB:.0f} MiB "
              f"({arrow_bytes / args.memory_bound:.1f}x as Arrow); engine chunk_rows {chunk:,} "
              f"(built in {time.perf_counter() - t0:.1f} s) ==", flush=True)
        spill = os.path.join(tmp, "spill")
        os.makedirs(spill)
        base = {"blob_root": blob_root, "refs": refs, "spill_dir": spill, "chunk_rows": chunk}
        modes = [("merge", []), ("copy", []), ("in-memory", [])]
        if args.patch:
            modes[1:1] = [("merge", ["put_file"]), ("merge", ["put_file", "system_pool"])]
        results: dict[str, list[dict]] = {}
        for r in range(args.merge_rounds):
            for mode, patch in modes:
                name = "+".join([mode, *patch])
                res = run_child({**base, "mode": mode, "patches": patch}, tmp)
                results.setdefault(name, []).append(res)
                print(f"  round {r + 1} {name}: {res['seconds']:.2f} s, {fmt_rate(res['rows_s'])} rows/s, "
                      f"peak RSS (VmHWM) {res['peak_rss_mb']:.0f} MB, at start {res['rss_before_mb']:.0f} MB", flush=True)
        best = {n: min(rs, key=lambda x: x["seconds"]) for n, rs in results.items()}
        peak = {n: max(x["peak_rss_mb"] for x in rs) for n, rs in results.items()}
        bound_mb = args.memory_bound / 1e6
        limit_mb = bound_mb + 200
        m = best["merge"]
        print("\n| case | seconds | rows/s | peak RSS (MB) | RSS at start (MB) | ratio rows/s to copy |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for n in best:
            b = best[n]
            print(f"| {n} | {b['seconds']:.2f} | {fmt_rate(b['rows_s'])} | {peak[n]:.0f} | {b['rss_before_mb']:.0f} | "
                  f"{b['rows_s'] / best['copy']['rows_s']:.2f}x |")
        print(f"\nmerge: rows out {m['rows_out']:,}, {m['bytes_out'] / 1e6:.0f} MB, {m['rounds']} merge rounds, "
              f"max buffered rows {m['max_buffered_rows']:,}")
        print("\n| target | ours | limit | ratio | need | status |")
        print("| --- | ---: | ---: | ---: | ---: | --- |")
        ok = peak["merge"] <= limit_mb
        print(f"| merge peak RSS <= bound + 200 MB | {peak['merge']:.0f} MB | {limit_mb:.0f} MB | "
              f"{peak['merge'] / limit_mb:.2f}x | <= 1.00x | {status(ok)} |")
        for n in ("merge+put_file", "merge+put_file+system_pool"):
            if n in peak:
                p = peak[n]
                print(f"| (prototype {n}) peak RSS | {p:.0f} MB | {limit_mb:.0f} MB | {p / limit_mb:.2f}x | "
                      f"<= 1.00x | {status(p <= limit_mb)} |")
        return {"arrow_bytes": arrow_bytes, "stored_bytes": stored, "chunk_rows": chunk, "results": results,
                "peak_rss_mb": peak, "limit_mb": limit_mb, "met": ok}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --- main ------------------------------------------------------------------------------------


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child_main(sys.argv[2])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller data, fewer rounds (about 25-30 s)")
    ap.add_argument("--rows", type=int, help="part A rows (default 4M, quick 1.5M)")
    ap.add_argument("--times", type=int, default=300, help="distinct timestamps")
    ap.add_argument("--rounds", type=int, help="part A rounds (default 3, quick 2)")
    ap.add_argument("--memory-bound", type=int, help="bytes (default 64 MiB, quick 32 MiB)")
    ap.add_argument("--merge-rows", type=int, help="part B rows (default 10M, quick 4M)")
    ap.add_argument("--inputs", type=int, help="part B batches (default 6, quick 4)")
    ap.add_argument("--merge-rounds", type=int, help="part B rounds (default 2, quick 1)")
    ap.add_argument("--patch", action="store_true",
                    help="part B: also run the prototypes (streaming put_file; + system memory pool)")
    ap.add_argument("--profile", action="store_true", help="part A: cProfile one extra compact()")
    ap.add_argument("--only", choices=["a", "b", "c"],
                    help="run one part (c: the stream, unsealed vs sealed, per pass; bench/compact_stream.py)")
    ap.add_argument("--steps", type=int, default=12, help="part C steps")
    ap.add_argument("--step-rows", type=int, help="part C rows per step (default 1M, quick 200k)")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--json")
    args = ap.parse_args()
    q = args.quick
    args.rows = args.rows or (1_500_000 if q else 4_000_000)
    args.rounds = args.rounds or (2 if q else 3)
    args.memory_bound = args.memory_bound or ((32 if q else 64) * MiB)
    args.merge_rows = args.merge_rows or (4_000_000 if q else 10_000_000)
    args.inputs = args.inputs or (4 if q else 6)
    args.merge_rounds = args.merge_rounds or (1 if q else 2)
    print(f"machine: {os.cpu_count()} cores, Python {platform.python_version()}, pyarrow {pa.__version__}, "
          f"load average {os.getloadavg()[0]:.1f}; dir {args.dir}")
    t0 = time.perf_counter()
    out: dict = {"args": vars(args)}
    if args.only in (None, "a"):
        out["a"] = part_a(args)
    if args.only in (None, "b"):
        out["b"] = part_b(args)
    if args.only == "c":  # several minutes: run on request
        from compact_stream import part_stream

        args.step_rows = args.step_rows or (200_000 if q else 1_000_000)
        out["c"] = part_stream(args)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s; load average {os.getloadavg()[0]:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main()
