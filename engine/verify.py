"""Offline verification of a data directory: every checksum and invariant, changing nothing.

``sediment verify`` prints what this returns. A *problem* is damage that stops the
engine from opening or loses data (exit code 1); a *note* is something the engine
cleans up by itself on open, such as a torn tail left by a crash.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from sediment.engine.data_dir import (
    DataDir,
    WalSpec,
    foreign_dir_problem,
    parse_wal,
    read_storage_record,
    trace_ends,
    traces_past_log,
)
from sediment.errors import SedimentError
from sediment.wal import segment as sg
from sediment.wal.control import CONTROL_NAME, ControlFile


@dataclass
class VerifyReport:
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    wal_findings: list = field(default_factory=list)  # log_reader.Problem, for --json and repair reports
    wal_end: int | None = None  # the LSN after the last record the file log would hold after open
    what: str = "file"  # what ``checked`` lists, one of them (a replicated engine's are not all files)
    kinds: str = ""  # which kinds of items, for the summary line

    @property
    def ok(self) -> bool:
        return not self.problems


def wal_partitions(directory: str) -> list[int]:
    """Partitions of a file log: those in its control file, else those with a manifest or directory."""
    found = {int(n[len("sediment-wal-"):-len(".manifest")]) for n in os.listdir(directory)
             if n.startswith("sediment-wal-") and n.endswith(".manifest") and n[13:-9].isdigit()}
    found |= {int(n) for n in os.listdir(directory) if n.isdigit() and os.path.isdir(os.path.join(directory, n))}
    return sorted(found)


def verify_wal(directory: str, report: VerifyReport, *, expected: bool = True, repair: bool = False,
               names: dict[int, str] | None = None) -> None:
    """Open's recovery run, read-only: the same checks of the control file and manifest, then
    the shared reader (wal/log_reader.py) over every partition. A fatal finding (open would
    refuse, or acknowledged records are lost) is a problem; the rest (a crash's torn tail,
    garbage below the trim point, an index to rebuild) are notes. ``repair``: plan as
    ``--repair`` would, so ``wal_findings`` holds what a repair would lose."""
    from sediment.wal import log_reader as lr
    from sediment.wal import manifest as mf

    if not os.path.isdir(directory) or not os.listdir(directory):
        (report.problems if expected else report.notes).append(
            f"{directory}: no write-ahead log" + (" where the metadata records one; restore it" if expected else " yet"))
        return
    from sediment.wal.log_open import decide_open

    # Open's own rule (wal/log_open.py) decides whether the log opens, is created or is
    # refused; what follows only looks deeper, and does not repeat a refusal in other words.
    problems = report.problems
    try:
        decision = decide_open(directory, 0, None, create=not expected, repair=False)
    except SedimentError as exc:
        report.problems.append(str(exc))
        problems = []
    else:
        if decision.manifest == "new":
            report.notes.append(f"{directory}: a log whose creation was interrupted (no manifest, no record): "
                                "open finishes creating it; nothing acknowledged can be in it")
            return
    ctl = None
    try:
        ctl = ControlFile.open(directory)
        for pid in ctl.partitions:
            ctl.read_state(pid)
        report.checked.append(ctl.path)
    except FileNotFoundError:
        problems.append(f"{os.path.join(directory, CONTROL_NAME)}: offset 0: control file missing while the "
                        "log exists (open refuses; `verify --repair` rebuilds it with the log's cluster key)")
    except SedimentError as exc:
        problems.append(str(exc))
        return
    for pid in sorted(set(ctl.partitions if ctl else []) | set(wal_partitions(directory))):
        pdir = os.path.join(directory, str(pid))
        found = problems if pid == 0 else report.problems  # open's own refusal already names partition 0's
        rebuilt = False
        try:
            manifest = mf.read(directory, pid)
            report.checked.append(os.path.join(directory, mf.manifest_name(pid)))
        except SedimentError as exc:
            found.append(str(exc))
            if not repair or ctl is None:
                continue
            manifest, rebuilt = mf.Manifest(ctl.header.cluster_key, pid), True
        if ctl is not None and manifest.cluster_key != ctl.header.cluster_key:
            found.append(f"{os.path.join(directory, mf.manifest_name(pid))}: offset 8: manifest belongs to "
                         f"cluster {manifest.cluster_key}, control file to {ctl.header.cluster_key}")
            continue
        if ctl is not None and pid not in ctl.partitions:
            found.append(f"{ctl.path}: partition {pid} has a log but is not in the control file")
        firsts, _ = lr.list_segments(pdir)
        if rebuilt and firsts:
            manifest.start_lsn = firsts[0]
        plan = lr.plan(pdir, manifest, repair=repair, rebuilt=rebuilt)
        report.wal_findings += plan.problems
        if pid == 0:
            ends = [k.next_lsn for k in plan.segments] + [plan.new_active or 0, manifest.active_first]
            report.wal_end = max(ends)
        for p in plan.problems:
            (report.problems if p.fatal else report.notes).append(p.describe(names))
        for k in plan.segments:
            report.checked.append(k.path)
            idx_path = os.path.join(pdir, sg.index_name(k.first_lsn))
            idx_header, entries = sg.read_index(idx_path)
            if idx_header is None:
                report.notes.append(f"{idx_path}: missing or bad index header (rebuilt at open)")
            elif any(a != b for a, b in zip(entries, k.offsets, strict=False)):
                report.notes.append(f"{idx_path}: entries disagree with the data file (rebuilt at open)")


def verify_device(path: str, report: VerifyReport) -> None:
    """The ring's own recovery (wal/device/recovery.py, the code ``DeviceLog.open`` runs) run
    read-only, so the verdict cannot drift from open's: a problem exactly when open would
    refuse (missing or blank ring, damaged header copies, records ending before the recorded
    durable end, damage followed by acknowledged records), a note for what open cuts or
    rewrites by itself (a crash's torn tail, one damaged header copy)."""
    from sediment.errors import WalCorruption, WalShortened
    from sediment.wal.device.recovery import inspect
    from sediment.wal.log_reader import Problem

    try:
        found = inspect(path)
    except SedimentError as exc:
        report.problems.append(str(exc))
        if isinstance(exc, (WalShortened, WalCorruption)) and exc.offset >= 0:
            # acknowledged records are damaged: a repair must not go ahead without --force
            last = (exc.lost_to - 1) if isinstance(exc, WalShortened) and exc.lost_to > 0 else exc.offset
            report.wal_findings.append(Problem("damage", path, exc.offset, exc.offset, last, exc.reason,
                                               fatal=True, lost=True))
        return
    except OSError as exc:
        report.problems.append(f"{path}: cannot read the device ring: {exc}")
        return
    report.checked.append(path)
    if found.valid_copies == 1:
        report.notes.append(f"{path}: one ring header copy is damaged; the other is used (rewritten at open)")
    for where, off, cut, why in found.recovered.torn_tails:
        report.notes.append(f"{where}: logical offset {off}: {why} ({cut} bytes cut at open)")


def verify_trace_batches(meta: dict, uri: str, s3_endpoint: str | None, report: VerifyReport) -> None:
    """Every relation's trace in ``meta`` (key -> Versioned): its invariants, and every batch
    it references read in full (size, whole-object and footer CRC32C recorded in the trace
    state, footer description, schema against the catalog, Parquet page checksums, row count).
    A trace state no entry names is a note (engine/unused_traces.py)."""
    from sediment.blob.uri import open_blob_store
    from sediment.engine.catalog import RELATIONS, RelationEntry
    from sediment.engine.unused_traces import find_unused
    from sediment.trace.state import TraceState
    from sediment.trace.store import TraceStore, missing_state, state_key

    report.notes += [unused.describe() for unused in find_unused(meta)]
    blobs = open_blob_store(uri, s3_endpoint=s3_endpoint) if uri.startswith("s3://") else open_blob_store(uri)
    store = TraceStore(meta=None, blobs=blobs)  # type: ignore[arg-type]
    try:
        _verify_owner(meta, blobs, uri, report)
        for key, value in sorted(meta.items()):
            if not key.startswith(RELATIONS):
                continue
            try:
                entry = RelationEntry.decode(value.value, value.version, key)
                raw = meta.get(state_key(entry.id))
                if raw is None:
                    if entry.traced:  # written when the relation was added: lost since (open refuses)
                        report.problems.append(str(missing_state(entry.id, entry.name)))
                    continue
                state = TraceState.decode(raw.value)
            except SedimentError as exc:
                report.problems.append(f"relation {key[len(RELATIONS):]!r}: {exc}")
                continue
            report.checked += [f"{uri}/{k}" for k in state.keys()]
            store.set_layout(entry.id, entry.schema_history.layout())  # a batch of any schema version is good
            report.problems += [f"relation {entry.name!r}: {p}" for p in store.verify(state)]
    finally:
        blobs.close()


def _verify_owner(meta: dict, blobs, uri: str, report: VerifyReport) -> None:
    """The blob prefix's owner marker names this data directory's engine identity (else the
    engine refuses to open: blob/owner.py)."""
    from sediment.blob.owner import read_owner

    recorded, _version = read_storage_record(meta)
    engine_id = recorded.engine_id if recorded is not None else None
    try:
        owner = read_owner(blobs, uri)
    except SedimentError as exc:
        report.problems.append(str(exc))
        return
    if owner is not None and owner.engine_id != engine_id:  # no recorded identity: open would make a new one
        report.problems.append(f"blob prefix {uri} belongs to engine {owner.engine_id} (data directory "
                               f"{owner.data_dir or '?'}), not to this data directory's engine {engine_id or '(none recorded yet)'}; "
                               "the engine refuses to open it (see --take-over-blob-prefix)")


def _read_meta(meta_dir: str) -> tuple[dict | None, SedimentError | None]:
    """The local metadata as an open would restore it (None without a directory), or why it cannot be read."""
    from sediment.metadata.journal import load_readonly

    if not os.path.isdir(meta_dir):
        return None, None
    try:
        return load_readonly(meta_dir), None
    except SedimentError as exc:
        return None, exc


def relation_names(meta_dir: str, meta: dict | None = None) -> dict[int, str]:
    """Relation id -> name from the catalog in the metadata (``meta``, else read from ``meta_dir``;
    empty when it cannot be read)."""
    from sediment.engine.catalog import RELATIONS, RelationEntry

    meta = meta if meta is not None else _read_meta(meta_dir)[0]
    try:
        entries = [RelationEntry.decode(v.value, v.version, k) for k, v in (meta or {}).items()
                   if k.startswith(RELATIONS)]
    except SedimentError:
        return {}
    return {e.id: e.name for e in entries}


def _recorded_wal(meta: dict | None, unreadable: SedimentError | None) -> tuple[WalSpec, bool]:
    """The WAL this data directory was created with (its storage record), and whether one is recorded."""
    try:
        recorded = read_storage_record(meta)[0] if meta is not None else None
    except SedimentError:
        return parse_wal(None), True
    if recorded is None:
        return parse_wal(None), unreadable is not None
    return recorded.wal_spec, True


def verify_data_dir(data_dir: str, *, blob: str | None = None, s3_endpoint: str | None = None,
                    repair: bool = False) -> VerifyReport:
    """Verify a whole engine data directory (log, metadata, traces and their batches) without
    opening the engine or changing anything."""
    report = VerifyReport()
    if not os.path.isdir(data_dir):
        report.problems.append(f"{data_dir}: no such data directory")
        return report
    paths = DataDir(data_dir)
    cluster = paths.member_of()
    if cluster is not None:  # its partitions are engines of their own, each in partitions/<n>
        report.problems.append(f"{data_dir} is a cluster member's directory (a member of {cluster}), not an "
                               "engine's: nothing was checked; verify each of its partitions with sediment "
                               f"verify --data-dir {os.path.join(data_dir, 'partitions', 'N')}")
        return report
    foreign = foreign_dir_problem(data_dir)
    if foreign is not None:
        report.problems.append(f"{foreign}: nothing was checked; pass the data directory of an engine")
        return report
    meta, unreadable = _read_meta(paths.meta)
    wal, recorded = _recorded_wal(meta, unreadable)
    missing = paths.meta_missing()
    if missing is not None:
        report.problems.append(str(missing))
    if wal.kind == "device":
        verify_device(wal.location, report)
    else:
        verify_wal(paths.wal, report, expected=recorded, repair=repair, names=relation_names(paths.meta, meta))
    if os.path.isdir(paths.meta):
        from sediment.metadata.journal import verify as verify_journal

        for line in verify_journal(paths.meta):
            (report.notes if "torn tail" in line else report.problems).append(line)
        report.checked.append(paths.meta)
        if meta is None:
            report.problems.append(str(unreadable))
            return report
        verify_trace_batches(meta, blob or paths.default_blob_uri, s3_endpoint, report)
        if report.wal_end is not None:  # open's check that the log reaches every trace's wal_through
            report.problems += [str(p) for p in traces_past_log(data_dir, report.wal_end, trace_ends(meta))]
    elif blob is not None:  # no engine here yet: open would refuse a blob prefix another engine owns
        verify_trace_batches({}, blob, s3_endpoint, report)
    return report
