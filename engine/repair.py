"""``sediment verify --repair``: cut a damaged log without destroying what verifies.

The repair is open's recovery run with ``repair=True`` (wal/log_reader.py decides; the
log applies): every record that passes its checksums and is reachable is kept, holes are
recorded in the manifest, appends resume past the highest LSN the log ever acknowledged.
Before changing anything the same reader plans the repair read-only; if the plan loses
records the log had acknowledged (a segment or durable end the manifest records), the
repair is refused unless ``force``. What was lost is written, human-readable and as JSON,
to ``<data dir>/repair-<time>.txt`` / ``.json`` (fsynced, directory fsynced). Empty trace
states no catalog entry names (an add interrupted between its two writes) are deleted and
listed there too (engine/unused_traces.py).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sediment._fs import replace_durably
from sediment.engine.data_dir import DataDir
from sediment.engine.unused_traces import delete_unused
from sediment.engine.verify import relation_names, verify_data_dir
from sediment.errors import RepairRefused


@dataclass
class RepairResult:
    lines: list[str] = field(default_factory=list)  # one per cut / loss, for humans
    findings: list[dict] = field(default_factory=list)  # Problem.to_json() plus relation names
    report_paths: list[str] = field(default_factory=list)


def _named(finding: dict, names: dict[int, str]) -> dict:
    rels = finding.get("relations", {})
    finding["relations"] = {names.get(int(r), f"relation id {r}"): v for r, v in rels.items()}
    return finding


def repair_data_dir(data_dir: str, open_engine: Callable[[], object], *, force: bool,
                    **blob_options: object) -> RepairResult:
    """Repair the data directory's log; RepairRefused (nothing changed) when acknowledged
    records would be lost and not ``force``. ``open_engine()`` opens it with repair=True."""
    planned = verify_data_dir(data_dir, repair=True, **blob_options)  # type: ignore[arg-type]
    lost = [p for p in planned.wal_findings if p.lost]
    if lost and not force:
        raise RepairRefused(
            f"repair of {data_dir} would lose records the log had acknowledged: "
            + "; ".join(p.describe(relation_names(DataDir(data_dir).meta)) for p in lost)
            + ". Nothing was changed. Restore the missing files if you can; re-run with --force to accept the loss")
    result = RepairResult()
    with open_engine() as engine:  # type: ignore[attr-defined]
        wal = engine.wal
        names = {rel.entry.id: name for name, rel in engine.view.relations.items()}
        problems = list(getattr(wal, "problems", []))
        result.lines = [p.describe(names) for p in problems if p.kind != "stray"] or list(wal.report.describe())
        result.findings = [_named(p.to_json(), names) for p in problems]
        result.lines += [f"{path}: original bytes kept before the cut" for path in getattr(wal, "preserved", [])]
        for unused, deleted in delete_unused(engine):
            result.lines.append(f"deleted {unused.key}: an empty trace state no catalog entry names" if deleted
                                else f"kept: {unused.describe()}")
            result.findings.append({"kind": "unused_trace_state", "key": unused.key, "relation_id": unused.relation_id,
                                    "batches": unused.refs, "deleted": deleted, "lost": False})
    if result.findings:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        doc = {"data_dir": data_dir, "time": stamp, "forced": force,
               "lost": [f for f in result.findings if f["lost"]], "findings": result.findings}
        for ext, text in (("json", json.dumps(doc, indent=2, sort_keys=True) + "\n"),
                          ("txt", "".join(f"{line}\n" for line in result.lines))):
            path = os.path.join(data_dir, f"repair-{stamp}.{ext}")
            replace_durably(path, text.encode())
            result.report_paths.append(path)
    return result
