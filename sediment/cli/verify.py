"""``sediment verify``: open's recovery run, read-only, and ``--repair``."""

from __future__ import annotations

import argparse
import os

from sediment._fs import flock_holder
from sediment.cli.common import data_dir_of, open_engine, progress_for
from sediment.cli.files import _one_line
from sediment.engine.data_dir import DataDir, read_marker
from sediment.engine.verify import VerifyReport, verify_data_dir
from sediment.engine.verify_replicated import verify_engine
from sediment.errors import InvalidArgument, SedimentError
from sediment.wording import counted


def _print_report(report: VerifyReport, verbose: bool) -> None:
    """One line per note and problem (each names its file and offset), so scripts can grep them."""
    print(f"checked {counted(len(report.checked), report.what)}" + (f" ({report.kinds})" if report.kinds else ""))
    if verbose:
        for path in report.checked:
            print(f"  {path}")
    for note in report.notes:
        print(f"note: {_one_line(note)}")
    for problem in report.problems:
        print(f"problem: {_one_line(problem)}")
    problems = len(report.problems)
    print("ok: no problems" if not problems else f"{counted(problems, 'problem')} found")


def cmd_verify(args: argparse.Namespace) -> int:
    """Read-only unless ``--repair``: verify is open's recovery run without writing (exit 0
    exactly when the engine would open with nothing acknowledged lost). ``--repair`` keeps
    every record that verifies, reports what was lost (engine/repair.py) and refuses a loss
    of acknowledged records without ``--force``."""
    from sediment.engine.repair import repair_data_dir

    data_dir = data_dir_of(args)
    blob_options = {"blob": getattr(args, "blob", None), "s3_endpoint": getattr(args, "s3_endpoint", None)}
    metadata = getattr(args, "metadata", None)
    replicated = bool(metadata and metadata.startswith("zk://"))
    try:
        replicated = replicated or (os.path.isdir(data_dir) and read_marker(data_dir) is not None)
    except SedimentError:
        replicated = True  # a damaged marker: verify reports it
    if args.repair and replicated:
        raise InvalidArgument(f"`verify --repair` repairs a local data directory; {data_dir} is a replicated "
                              "engine's, whose log the storage nodes' recovery repairs at every open: run "
                              "`sediment verify` to see what is wrong, then open the engine")
    holder = flock_holder(DataDir(data_dir).lock) if os.path.isdir(data_dir) else None
    with progress_for(args, 0, f"verify {data_dir}", ""):
        report = verify_engine(data_dir, metadata=metadata, **blob_options)
    if holder is not None:
        report.notes.insert(0, f"{data_dir} is in use by process {holder}: its log is being written, so this checks "
                               "a moving target (a torn tail at the end of the active segment is a write under way, "
                               "not a crash's); stop that process for an exact check")
    if getattr(args, "json", False) and not args.repair:
        import json

        print(json.dumps({"ok": report.ok, "problems": report.problems, "notes": report.notes,
                          "wal": [p.to_json() for p in report.wal_findings]}, indent=2, sort_keys=True))
        return 0 if report.ok else 1
    _print_report(report, args.verbose)
    if args.repair and DataDir(data_dir).holds_engine():  # else nothing to repair, and nothing is made
        result = repair_data_dir(data_dir, lambda: open_engine(args, repair=True, compact=False, discover=False),
                                 force=getattr(args, "force", False), **blob_options)
        for line in result.lines:
            print(f"repaired: {_one_line(line)}")
        if not result.lines:
            print("repaired: nothing to cut")
        for path in result.report_paths:
            print(f"repair report: {path}")
        print("after repair:")
        report = verify_data_dir(data_dir, **blob_options)
        _print_report(report, args.verbose)
    elif not report.ok and DataDir(data_dir).holds_engine() and not replicated:
        print("`sediment verify --repair` keeps every record that verifies and reports what is lost "
              "(--force to accept losing acknowledged records)")
    return 0 if report.ok else 1
