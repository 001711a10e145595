"""Offline verification of a data directory: every checksum and invariant, changing nothing.

``sediment verify`` prints what this returns. A *problem* is damage that stops the
engine from opening or loses data (exit code 1); a *note* is something the engine
cleans up by itself on open, such as a torn tail left by a crash.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from sediment.errors import SedimentError
from sediment.wal import segment as sg
from sediment.wal.control import CONTROL_NAME, ControlFile


@dataclass
class VerifyReport:
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_wal(directory: str, report: VerifyReport) -> None:
    """Check the control file and every segment and index of every partition under ``directory``."""
    if not os.path.exists(os.path.join(directory, CONTROL_NAME)):
        report.notes.append(f"{directory}: no write-ahead log yet")
        return
    try:
        ctl = ControlFile.open(directory)
        for pid in ctl.partitions:
            ctl.read_state(pid)
    except SedimentError as exc:
        report.problems.append(str(exc))
        return
    report.checked.append(ctl.path)
    for pid in ctl.partitions:
        pdir = os.path.join(directory, str(pid))
        if not os.path.isdir(pdir):
            continue
        firsts = sorted(p[0] for p in map(sg.parse_name, os.listdir(pdir)) if p and p[1] == "seg")
        expected = None
        for i, first in enumerate(firsts):
            path = os.path.join(pdir, sg.segment_name(first))
            report.checked.append(path)
            is_last = i == len(firsts) - 1
            with open(path, "rb") as f:
                header = sg.parse_header(f.read(sg.HEADER_SIZE))
            if header is None or header.magic != sg.SEG_MAGIC:
                (report.notes if is_last else report.problems).append(
                    f"{path}: offset 0: bad segment header" + (" (unfinished creation; cut at open)" if is_last else ""))
                continue
            if header.first_lsn != first or header.cluster_key != ctl.header.cluster_key:
                report.problems.append(f"{path}: offset 0: header names first LSN {header.first_lsn} / cluster "
                                       f"{header.cluster_key}, expected {first} / {ctl.header.cluster_key}")
            if expected is not None and first != expected:
                report.problems.append(f"{path}: offset 0: LSN gap, previous segment ends before {expected}")
            scan = sg.scan_segment(path, first)
            expected = scan.next_lsn
            if not scan.clean:
                where = f"{path}: offset {scan.bad_offset}: {scan.reason}"
                if is_last and not scan.valid_after_bad:
                    report.notes.append(f"{where} (torn tail from a crash; cut at open)")
                else:
                    report.problems.append(where + ("; valid records follow" if scan.valid_after_bad else
                                                    "; in a finished segment"))
            idx_path = os.path.join(pdir, sg.index_name(first))
            idx_header, entries = sg.read_index(idx_path)
            if idx_header is None:
                (report.notes if is_last else report.problems).append(f"{idx_path}: missing or bad index header "
                                                                      "(rebuilt at open)")
            else:
                for n, (a, b) in enumerate(zip(entries, scan.offsets, strict=False)):
                    if a != b:
                        report.problems.append(f"{idx_path}: entry {n} (offset {sg.HEADER_SIZE + 8 * n}) says "
                                               f"{a}, record is at {b} (rebuilt at open)")
                        break


def verify_device(path: str, report: VerifyReport) -> None:
    """The ring's own recovery (wal/device_recovery.py, the code ``DeviceLog.open`` runs) run
    read-only, so the verdict cannot drift from open's: a problem exactly when open would
    refuse (missing or blank ring, damaged header copies, records ending before the recorded
    durable end, damage followed by acknowledged records), a note for what open cuts or
    rewrites by itself (a crash's torn tail, one damaged header copy)."""
    from sediment.wal.device_recovery import inspect

    try:
        found = inspect(path)
    except SedimentError as exc:
        report.problems.append(str(exc))
        return
    except OSError as exc:
        report.problems.append(f"{path}: cannot read the device ring: {exc}")
        return
    report.checked.append(path)
    if found.valid_copies == 1:
        report.notes.append(f"{path}: one ring header copy is damaged; the other is used (rewritten at open)")
    for where, off, cut, why in found.recovered.torn_tails:
        report.notes.append(f"{where}: logical offset {off}: {why} ({cut} bytes cut at open)")


def verify_traces(data_dir: str, blob: str | None, s3_endpoint: str | None, report: VerifyReport) -> None:
    """Every relation's trace: its invariants, and every batch it references read in full
    (size, whole-object and footer CRC32C recorded in the trace state, footer description,
    schema against the catalog, Parquet page checksums, row count)."""
    from sediment.blob.uri import open_blob_store
    from sediment.engine.catalog import RELATIONS, RelationEntry
    from sediment.engine.metadata_journal import load_readonly
    from sediment.engine.schema import update_schema
    from sediment.trace.state import TraceState
    from sediment.trace.store import TraceStore, state_key

    try:
        meta = load_readonly(os.path.join(data_dir, "meta"))
    except SedimentError as exc:
        report.problems.append(str(exc))
        return
    uri = blob or "file://" + os.path.join(data_dir, "blobs")
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
                    continue
                state = TraceState.decode(raw.value)
            except SedimentError as exc:
                report.problems.append(f"relation {key[len(RELATIONS):]!r}: {exc}")
                continue
            report.checked += [f"{uri}/{k}" for k in state.keys()]
            report.problems += [f"relation {entry.name!r}: {p}"
                                for p in store.verify(state, update_schema(entry.schema))]
    finally:
        blobs.close()


def _verify_owner(meta: dict, blobs, uri: str, report: VerifyReport) -> None:
    """The blob prefix's owner marker names this data directory's engine identity (else the
    engine refuses to open: blob/owner.py)."""
    import json

    from sediment.blob.owner import read_owner
    from sediment.engine.engine import STORAGE_KEY

    got = meta.get(STORAGE_KEY)
    engine_id = json.loads(got.value).get("engine_id") if got is not None else None
    try:
        owner = read_owner(blobs, uri)
    except SedimentError as exc:
        report.problems.append(str(exc))
        return
    if owner is not None and owner.engine_id != engine_id:  # no recorded identity: open would make a new one
        report.problems.append(f"blob prefix {uri} belongs to engine {owner.engine_id} (data directory "
                               f"{owner.data_dir or '?'}), not to this data directory's engine {engine_id or '(none recorded yet)'}; "
                               "the engine refuses to open it (see --take-over-blob-prefix)")


def _recorded_wal(meta_dir: str) -> str:
    """The WAL this data directory was created with (``engine/storage`` in its metadata)."""
    import json

    from sediment.engine.engine import STORAGE_KEY
    from sediment.engine.metadata_journal import load_readonly

    try:
        got = load_readonly(meta_dir).get(STORAGE_KEY) if os.path.isdir(meta_dir) else None
    except SedimentError:
        return "file"
    return (json.loads(got.value).get("wal") or "file") if got is not None else "file"


def verify_data_dir(data_dir: str, *, blob: str | None = None, s3_endpoint: str | None = None) -> VerifyReport:
    """Verify a whole engine data directory (log, metadata, traces and their batches) without
    opening the engine or changing anything."""
    report = VerifyReport()
    if not os.path.isdir(data_dir):
        report.problems.append(f"{data_dir}: no such data directory")
        return report
    meta = os.path.join(data_dir, "meta")
    wal = _recorded_wal(meta)
    if wal.startswith("device:"):
        verify_device(wal[len("device:"):], report)
    else:
        verify_wal(os.path.join(data_dir, "wal"), report)
    if os.path.isdir(meta):
        from sediment.engine.metadata_journal import verify as verify_journal

        for line in verify_journal(meta):
            (report.notes if "torn tail" in line else report.problems).append(line)
        report.checked.append(meta)
        verify_traces(data_dir, blob, s3_endpoint, report)
    return report
