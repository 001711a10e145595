"""Damage campaign: one pristine data directory per workload, closed cleanly; each trial copies
it, damages one file one way, runs ``sediment verify`` (the CLI's entry point) and opens the
engine to read every relation, and classifies what happened. Trials run in worker processes
(one per core) so a hang is bounded by a per-trial timeout: the worker is killed and the trial
counted as a hang.

Classes: ``same`` (every read equals the model), ``typed`` (a sediment.errors error at open
or read), ``reported`` (the engine opened with data missing but reported a cut), ``silent``
(a wrong answer and no report), ``untyped`` (any other exception), ``hang``. ``verify``
agrees with open when it exits 0 exactly when open gives the model's data.

When verify fails or open is not ``same``, the trial is repeated with ``sediment verify
--repair``: a log record that was intact in the damaged directory (its bytes equal to the
pristine ones) but is gone after the repair counts as a record the repair destroyed.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import sys
import time

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if TESTS not in sys.path:  # also run as a child process by its path: find the support package
    sys.path.insert(0, TESTS)

from support.faults_model import Model, check_engine, next_op, run_op, table_of  # noqa: E402

DAMAGES = ("bitflip", "truncate", "zero4k", "garbage", "delete")
CLASSES = ("same", "typed", "reported", "silent", "untyped", "hang")
PAGE = 4096


def options(wal: str, root: str) -> dict:
    if wal == "device":
        return {"wal": f"device:{os.path.join(root, 'ring')}", "wal_capacity": 2 << 20, "segment_bytes": 64 << 10}
    return {"segment_bytes": 16 << 10}


def build_pristine(root: str, wal: str, seed: int) -> Model:
    """A data directory holding every file kind: batches (compactions, merges), a metadata
    snapshot and journal (the second session's first change folds the first one's journal
    into the snapshot), several WAL segments (a transaction left open holds back the trim),
    closed cleanly. Returns the model of what it holds."""
    import sediment

    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    data, opts = os.path.join(root, "data"), options(wal, root)
    rng = random.Random(seed)
    model = Model()
    engine = sediment.open(data, **opts)
    try:
        for phase, n in ((0, 90), (1, 60)):
            if phase == 1:
                engine.close()
                engine = sediment.open(data, **opts)
                tx = engine.transaction()  # left open: its first LSN holds the WAL trim back
                tx.append("a", table_of("a", [[1, model.sealed["a"] + 1, 1]]))
            for _ in range(n):
                op = next_op(rng, model, compact_weight=0.08 if phase == 0 else 0.0, reopen_weight=0.0)
                run_op(engine, op)
                model.apply(op)
    finally:
        engine.close()
    return model


def file_kind(rel: str, segs: list[str]) -> str | None:
    parts = rel.split(os.sep)
    name = parts[-1]
    if name in ("LOCK", "lock", "model.json"):
        return None
    if parts[0] == "ring":
        return "ring"
    if parts[:2] == ["data", "wal"]:
        if name.endswith(".seg"):
            i = segs.index(rel)
            return "seg-last" if i == len(segs) - 1 else "seg-first" if i == 0 else "seg-mid"
        if name.endswith(".idx"):
            return "index"
        if name.endswith(".ctl"):
            return "control"
        return "wal-other"
    if parts[:2] == ["data", "meta"]:
        return {"journal": "meta-journal", "snapshot": "meta-snapshot"}.get(name, "meta-other")
    if parts[:2] == ["data", "blobs"]:
        return "batch" if name.endswith(".parquet") else "blob-other"
    return "other"


def list_files(root: str) -> dict[str, list[str]]:
    files = []
    for d, _dirs, names in os.walk(root):
        files += [os.path.relpath(os.path.join(d, n), root) for n in names]
    segs = sorted(f for f in files if f.endswith(".seg"))
    kinds: dict[str, list[str]] = {}
    for f in sorted(files):
        k = file_kind(f, segs)
        if k is not None:
            kinds.setdefault(k, []).append(f)
    return kinds


def plan_trial(kinds: dict[str, list[str]], seed: int, index: int, size_of) -> dict:
    """Trial ``index``: which file, which damage, where (same seed, same trial)."""
    rng = random.Random(f"{seed}:{index}")
    kind = sorted(kinds)[index % len(kinds)]
    damage = DAMAGES[(index // len(kinds)) % len(DAMAGES)]
    path = rng.choice(kinds[kind])
    size = size_of(path)
    spec = {"kind": kind, "path": path, "damage": damage, "size": size}
    if damage == "bitflip":
        spec["bits"] = [[rng.randrange(max(1, size)), rng.randrange(8)] for _ in range(rng.choice((1, 1, 2, 3)))]
    elif damage == "truncate":
        spec["length"] = rng.randrange(max(1, size))
    elif damage == "zero4k":
        spec["page"] = rng.randrange(max(1, -(-size // PAGE)))
    elif damage == "garbage":
        spec["bytes"] = rng.randbytes(rng.choice((1, 7, 64, 512, 4096))).hex()
    return spec


def apply_damage(root: str, spec: dict) -> tuple[int, int]:
    """Damage the file; returns the damaged byte range [lo, hi) (the whole file when deleted)."""
    path = os.path.join(root, spec["path"])
    size = spec["size"]
    d = spec["damage"]
    if d == "delete":
        os.unlink(path)
        return 0, size
    with open(path, "r+b") as f:
        if d == "bitflip":
            lo, hi = size, 0
            for off, bit in spec["bits"]:
                if off >= size:
                    continue
                f.seek(off)
                b = f.read(1)[0] ^ (1 << bit)
                f.seek(off)
                f.write(bytes([b]))
                lo, hi = min(lo, off), max(hi, off + 1)
            return lo, hi
        if d == "truncate":
            f.truncate(spec["length"])
            return spec["length"], size
        if d == "zero4k":
            off = spec["page"] * PAGE
            f.seek(off)
            n = min(PAGE, max(0, size - off))
            f.write(bytes(n))
            return off, off + n
        f.seek(0, 2)
        f.write(bytes.fromhex(spec["bytes"]))
        return size, size + len(spec["bytes"]) // 2
    raise ValueError(d)


def log_frames(root: str, wal: str) -> dict[tuple[str, int], tuple[int, bytes]]:
    """Every record frame of the pristine log: (file, offset) -> (LSN, bytes)."""
    from sediment.wal import record as rec
    from sediment.wal import segment as sg

    frames = {}
    if wal == "file":
        pdir = os.path.join(root, "data", "wal", "0")
        for name in sorted(os.listdir(pdir)):
            p = sg.parse_name(name)
            if not p or p[1] != "seg":
                continue
            path = os.path.join(pdir, name)
            scan = sg.scan_segment(path, p[0])
            with open(path, "rb") as f:
                data = f.read()
            ends = [*scan.offsets[1:], scan.end]
            for n, (off, end) in enumerate(zip(scan.offsets, ends, strict=True)):
                frames[(os.path.relpath(path, root), off)] = (p[0] + n, data[off:end])
        return frames
    from sediment.wal.device.log import RingHeader

    path = os.path.join(root, "ring")
    with open(path, "rb") as f:
        raw = f.read()
    hdr = max((h for h in (RingHeader.unpack(raw[:4096]), RingHeader.unpack(raw[4096:8192])) if h),
              key=lambda h: h.seq)
    area, span = 2 * hdr.block_size, hdr.capacity - 2 * hdr.block_size
    pos = hdr.trim
    while pos < hdr.trim + span:
        phys = area + pos % span
        head = rec.decode_header(raw[phys:phys + rec.HEADER_SIZE])
        if head is None or head.lsn != pos:
            aligned = -(-pos // hdr.block_size) * hdr.block_size
            if not any(raw[phys:phys + rec.HEADER_SIZE]) and aligned != pos:
                pos = aligned
                continue
            break
        frames[("ring", phys)] = (pos, raw[phys:phys + head.frame_size])
        pos += head.frame_size
    return frames


def intact(root: str, frames: dict) -> set[int]:
    """LSNs of the pristine frames whose bytes are unchanged in ``root``."""
    out, cache = set(), {}
    for (rel, off), (lsn, data) in frames.items():
        if rel not in cache:
            try:
                with open(os.path.join(root, rel), "rb") as f:
                    cache[rel] = f.read()
            except OSError:
                cache[rel] = b""
        if cache[rel][off:off + len(data)] == data:
            out.add(lsn)
    return out


def _cli(argv: list[str]) -> tuple[int, str]:
    from sediment.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return int(code or 0), out.getvalue()


def needed_lsn(root: str) -> int:
    """The least LSN not yet in every relation's batches (the trace states' ``wal_through``):
    log records below it are already compacted, so a repair may drop them."""
    from sediment.engine.catalog import RELATIONS, RelationEntry
    from sediment.metadata.journal import load_readonly
    from sediment.trace.state import TraceState
    from sediment.trace.store import state_key

    meta = load_readonly(os.path.join(root, "data", "meta"))
    least = None
    for key, value in meta.items():
        if key.startswith(RELATIONS):
            entry = RelationEntry.decode(value.value, value.version, key)
            raw = meta.get(state_key(entry.id))
            through = TraceState.decode(raw.value).wal_through if raw is not None else 0
            least = through if least is None else min(least, through)
    return least or 0


def run_trial(root: str, pristine: str, wal: str, model: Model, frames: dict, spec: dict,
              needed_from: int = 0) -> dict:
    import sediment
    from sediment.errors import SedimentError

    data = os.path.join(root, "data")

    def reset() -> tuple[int, int]:
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(pristine, root)
        return apply_damage(root, spec)

    reset()
    res = {"spec": spec}
    try:
        code, out = _cli(["verify", "--data-dir", data])
        res["verify"] = code
    except Exception as exc:  # noqa: BLE001 - verify itself crashed: an untyped failure
        res["verify"], out = 99, f"{type(exc).__name__}: {exc}"
    res["verify_out"] = out[-400:]
    try:
        with sediment.open(data, **options(wal, root)) as engine:
            check = check_engine(engine, model, None)
            cuts = engine.wal.report.describe()
            meta_report = getattr(engine.storage.meta, "report", None)  # the journal's own open report
            if meta_report is not None and meta_report.torn_tail is not None:
                cuts.append(f"metadata journal torn tail: {meta_report.torn_tail}")
        if check.ok:
            res["class"] = "same"
        else:
            # a reported loss counts only when the report names the damaged file
            named = [c for c in cuts if os.path.basename(spec["path"]) in c]
            res["class"] = "reported" if named else "silent"
            res["detail"] = check.detail[:300]
    except SedimentError as exc:
        res["class"], res["detail"] = "typed", f"{type(exc).__name__}: {str(exc)[:300]}"
    except Exception as exc:  # noqa: BLE001 - classified
        res["class"], res["detail"] = "untyped", f"{type(exc).__name__}: {str(exc)[:300]}"
    res["agree"] = (res["verify"] == 0) == (res["class"] == "same")
    res["destroyed"] = 0
    if res["verify"] != 0 or res["class"] != "same":
        reset()
        before = intact(root, frames)
        try:
            code, out = _cli(["verify", "--repair", "--data-dir", data])
            res["repair"] = code
            after = intact(root, frames)
            res["destroyed"] = len({lsn for lsn in before - after if lsn >= needed_from})
        except Exception as exc:  # noqa: BLE001 - a refusing repair is fine; record why
            res["repair"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    return res


def worker_main(argv: list[str]) -> int:
    """Build the pristine directory, then run the trial indices read from stdin, one JSON
    result line each on stdout."""
    workdir, wal, seed = argv[0], argv[1], int(argv[2])
    build = os.path.join(workdir, "build")
    pristine = os.path.join(workdir, "pristine")
    model = build_pristine(build, wal, seed)
    shutil.rmtree(pristine, ignore_errors=True)
    shutil.copytree(build, pristine)
    frames = log_frames(pristine, wal)
    needed = needed_lsn(pristine)
    kinds = list_files(pristine)
    os.write(1, (json.dumps({"ready": {k: len(v) for k, v in kinds.items()}, "frames": len(frames)}) + "\n").encode())
    for line in sys.stdin:
        index = int(line)
        spec = plan_trial(kinds, seed, index, lambda p: os.path.getsize(os.path.join(pristine, p)))
        spec["index"] = index
        t0 = time.monotonic()
        res = run_trial(build, pristine, wal, model, frames, spec, needed)
        res["seconds"] = round(time.monotonic() - t0, 3)
        os.write(1, (json.dumps(res) + "\n").encode())
    return 0


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "worker":
    sys.exit(worker_main(sys.argv[2:]))
