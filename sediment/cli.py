"""The ``sediment`` command: manage relations, append files, seal, read, verify a data directory.

    sediment [--data-dir DIR] relation add NAME --schema 'id:int64,name:string'
    sediment relation drop NAME | relation list
    sediment append NAME FILE.csv|FILE.parquet
    sediment seal NAME T      sediment since NAME T
    sediment read NAME --as-of T [--out FILE.csv|FILE.parquet]
    sediment verify [--repair]
    sediment demo [--rows N]
    sediment serve --listen HOST:PORT [--token T]     (clients: sediment.connect)

Users never see a traceback: every failure is one ``sediment: error: ...`` line on
stderr, exit code 2 for a malformed command line and 1 for an operation that
failed (``SEDIMENT_DEBUG=1`` re-raises, for developers). A failed command leaves
the data directory's contents as they were: inputs are checked before anything is
written, and an append is one transaction, so it lands whole or not at all.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import NoReturn

import pyarrow as pa
import pyarrow.compute as pc

import sediment
from sediment.cli_files import (  # noqa: F401  (InputError is part of the CLI's API)
    FORMATS,
    PARQUET_BATCH_ROWS,
    InputError,
    UsageError,
    _csv_chunks,
    _difference,
    _file_format,
    _input_size,
    _one_line,
    _parquet_chunks,
    _print_stats,
    _write_atomically,
    _write_stdout_csv,
)
from sediment.engine.schema import _SPEC_TYPES, check_name, conform_updates, parse_schema_spec, update_schema
from sediment.engine.verify import VerifyReport, verify_data_dir
from sediment.errors import SchemaMismatch, SedimentError, TimeAlreadySealed
from sediment.logs import LOG_LEVELS, configure_logging
from sediment.progress import Progress

DEFAULT_DATA_DIR = "./sediment-data"
DEFAULT_CHUNK_BYTES = 8 << 20  # CSV read block: the unit of an append chunk
KEEP_VALIDATED_BYTES = 256 << 20  # below this, the checked chunks are appended without reading the file again



LOCAL_ONLY = frozenset({"verify", "demo", "serve", "storage-node"})  # commands --connect cannot reach


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (argparse prints the usage block too)."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"sediment: error: {message} (see `{self.prog} --help`)\n")
        raise SystemExit(2)


# --- helpers --------------------------------------------------------------------------------


def _time_arg(text: str) -> int:
    """A time on the command line: an integer in [0, 2**63)."""
    try:
        t = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid time {text!r}: times are integers >= 0") from None
    if not 0 <= t < 1 << 63:
        raise argparse.ArgumentTypeError(f"invalid time {text!r}: times are integers in [0, 2**63)")
    return t


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}: give a positive integer") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}: give a positive integer")
    return n


def _type_name(t: pa.DataType) -> str:
    """The ``--schema`` spelling of a column type, so `relation list` output can be fed back."""
    for name, spec_type in _SPEC_TYPES.items():
        if spec_type == t:
            return name
    return str(t)


def _schema_spec(schema: pa.Schema) -> str:
    return ",".join(f"{f.name}:{_type_name(f.type)}" for f in schema)


def _describe(exc: BaseException) -> str:
    """An exception as the one line a user reads."""
    if isinstance(exc, OSError) and exc.strerror:
        where = exc.filename if exc.filename is not None else ""
        text = f"{where}: {exc.strerror}" if where else exc.strerror
    else:
        text = str(exc) or type(exc).__name__
    return _one_line(text)


def _data_dir(args: argparse.Namespace) -> str:
    return os.path.abspath(os.path.expanduser(args.data_dir))


def _open(args: argparse.Namespace, *, create: bool = False, **options: object) -> sediment.Engine:
    """Open the engine; only commands that create things may create the data directory. With
    ``--connect`` the engine is a served coordinator's, reached through a client that has the
    same methods, so every command reads the same either way."""
    if getattr(args, "connect", None):
        token = args.token if getattr(args, "token", None) else os.environ.get("SEDIMENT_TOKEN")
        if not token:
            raise UsageError("--connect needs a token: pass --token T or set $SEDIMENT_TOKEN")
        return sediment.connect(args.connect, token=token, tls_root_certs=getattr(args, "tls_root_certs", None))
    data_dir = _data_dir(args)
    if not create and not os.path.isdir(data_dir) and not getattr(args, "metadata", None):
        # (with --metadata the engine may live in a shared store: a new coordinator's directory is fine)
        raise SedimentError(f"no data directory at {data_dir}; `sediment relation add` creates one, or pass "
                            "--data-dir")
    if getattr(args, "blob", None):
        options.setdefault("blob", args.blob)
        options.setdefault("s3_endpoint", getattr(args, "s3_endpoint", None))
    if getattr(args, "metadata", None):
        options.setdefault("metadata", args.metadata)
    if getattr(args, "replicas", None):
        options.setdefault("replicas", [r.strip() for r in args.replicas.split(",") if r.strip()])
    if getattr(args, "cluster_key", None):
        options.setdefault("cluster_key", args.cluster_key)
    if getattr(args, "take_over_blob_prefix", False):
        options.setdefault("take_over_blob_prefix", True)
    if getattr(args, "max_wal_backlog", None) is not None:
        options.setdefault("max_wal_backlog", args.max_wal_backlog)
    return sediment.open(data_dir, **options)


def _progress(args: argparse.Namespace, total: int | None, label: str, unit: str) -> Progress:
    force = getattr(args, "progress", None)
    if force is None and getattr(args, "log_format", "text") == "json":
        force = False  # stderr carries JSON log lines only, unless progress is asked for
    return Progress(total, label, unit, force=force)


# --- relation -------------------------------------------------------------------------------


def cmd_relation_add(args: argparse.Namespace) -> int:
    """Checks the name and schema before opening, so a bad command creates no directory. A
    --schema that does not parse is a malformed command line (exit code 2)."""
    check_name(args.name)
    try:
        schema = parse_schema_spec(args.schema)
    except SchemaMismatch as exc:
        raise UsageError(f"--schema: {exc}") from None
    with _open(args, create=True) as engine:
        engine.add_relation(args.name, schema)
    print(f"added relation {args.name} ({_schema_spec(schema)})")
    return 0


def cmd_relation_drop(args: argparse.Namespace) -> int:
    """The relation's WAL records stay until the log is trimmed, but are ignored from now on."""
    check_name(args.name)
    with _open(args) as engine:
        engine.drop_relation(args.name)
    print(f"dropped relation {args.name}")
    return 0


def cmd_relation_list(args: argparse.Namespace) -> int:
    """One line per relation, tab-separated: name, schema (as --schema spells it), since, sealed."""
    with _open(args) as engine:
        rows = [(name, _schema_spec(engine.schema(name)), engine.since(name), engine.sealed(name))
                for name in engine.relations()]
    for name, spec, since, sealed in rows:
        print(f"{name}\t{spec}\tsince={since}\tsealed={sealed}")
    if not rows:
        print(f"no relations in {_data_dir(args)}", file=sys.stderr)
    return 0


# --- append ---------------------------------------------------------------------------------


def cmd_append(args: argparse.Namespace) -> int:
    """Two passes so that bad input never touches the log: first every chunk is parsed and
    checked against the relation (types, nulls, negative or sealed times), then the chunks
    go into one transaction, committed at the end, so the file lands whole or not at all."""
    path = args.file
    fmt = _file_format(path, args.format, "input file")
    if not os.path.isfile(path):
        if os.path.exists(path):
            raise InputError(f"{path}: not a regular file")
        raise InputError(f"{path}: no such file")
    check_name(args.name)
    with _open(args) as engine:
        schema = engine.schema(args.name)
        target = update_schema(schema)
        sealed = engine.sealed(args.name)
        total = _input_size(path, fmt)
        unit = "B" if fmt == "csv" else "rows"

        def chunks() -> Iterator[tuple[pa.Table, int]]:
            return _csv_chunks(path, target, args.chunk_bytes) if fmt == "csv" else _parquet_chunks(path)

        kept: list[pa.Table] | None = []
        kept_bytes = 0
        rows = 0
        t_lo: int | None = None
        t_hi: int | None = None
        with _progress(args, total, f"check {os.path.basename(path)}", unit) as bar:
            for chunk, position in chunks():
                try:
                    table, _bounds = conform_updates(args.name, schema, chunk)
                except SedimentError as exc:
                    raise type(exc)(f"{path}: {exc}") from None
                if table.num_rows:
                    lo, hi = (v.as_py() for v in pc.min_max(table.column("time")).values())
                    if lo <= sealed:
                        raise TimeAlreadySealed(
                            f"{path}: relation {args.name!r} is sealed through time {sealed}, but the file has "
                            f"updates at time {lo}; append at times > {sealed}")
                    t_lo = lo if t_lo is None else min(t_lo, lo)
                    t_hi = hi if t_hi is None else max(t_hi, hi)
                    rows += table.num_rows
                    if kept is not None:
                        kept.append(table)
                        kept_bytes += table.nbytes
                        if kept_bytes > KEEP_VALIDATED_BYTES:
                            kept = None  # too big to hold: read the file again to append
                bar.set(position)
        if rows == 0:
            print(f"appended 0 rows to {args.name} from {path} (the file has no updates)")
            return 0

        again = (t for t, _ in chunks()) if kept is None else iter(kept)
        txn = engine.transaction()
        try:
            with _progress(args, rows, f"append {os.path.basename(path)}", "rows") as bar:
                for table in again:
                    if table.num_rows:
                        txn.append(args.name, table)
                        bar.update(table.num_rows)
            txn.commit()
        except BaseException:
            try:
                txn.abort()
            except Exception:  # noqa: BLE001 - report the first failure, not the abort's
                pass
            raise
    print(f"appended {rows} rows to {args.name} from {path} (times {t_lo}..{t_hi})")
    return 0


# --- frontiers ------------------------------------------------------------------------------


def cmd_seal(args: argparse.Namespace) -> int:
    """Promise no more updates at times <= T, which makes reads as of T possible."""
    with _open(args) as engine:
        engine.seal(args.name, args.t)
    print(f"sealed {args.name} through time {args.t}")
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    """Run one full compaction pass and wait for it (the background compacter does the same)."""
    with _open(args) as engine:
        names = [args.name] if args.name else engine.relations()
        before = {n: engine.trace_info(n) for n in names}
        with _progress(args, 0, "compact " + (args.name or f"{len(names)} relations"), ""):
            engine.compact(args.name)
        for n in names:
            info = engine.trace_info(n)
            print(f"compacted {n}: {info['batches']} batches, {info['rows']} rows, upper {info['upper']}, "
                  f"{info['tail_records']} WAL records left (was {before[n]['tail_records']})")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    """What the engine holds: per relation rows, batches, bytes, frontiers, WAL tail and
    compaction lag; the WAL's size and backlog; where the storage lives."""
    import json

    with _open(args) as engine:
        stats = engine.stats()
    if args.json:
        print(json.dumps(stats, indent=2, sort_keys=True))
    else:
        _print_stats(stats)
    return 0


def cmd_since(args: argparse.Namespace) -> int:
    """Let history below T be consolidated away (reads below T become impossible)."""
    with _open(args) as engine:
        engine.set_since(args.name, args.t)
    print(f"since of {args.name} is now {args.t}")
    return 0


# --- read -----------------------------------------------------------------------------------


def cmd_read(args: argparse.Namespace) -> int:
    """The relation as of ``--as-of``: its columns plus ``diff``, consolidated and sorted; with
    ``--from T0`` the consolidated changes in (T0, as-of] instead (the snapshot at as-of minus
    the snapshot at T0, so both times must be readable: since <= T0 <= as-of <= sealed)."""
    fmt = _file_format(args.out, args.format, "output file") if args.out else "csv"
    if not args.out and args.format == "parquet":
        raise UsageError("--format parquet needs --out FILE; stdout gets CSV")
    if args.from_t is not None and args.from_t > args.as_of:
        raise UsageError(f"--from {args.from_t} is after --as-of {args.as_of}: changes run forward in time")
    with _open(args) as engine:
        table = engine.snapshot(args.name, args.as_of)
        if args.from_t is not None:
            table = _difference(table, engine.snapshot(args.name, args.from_t))
    what = f"as of {args.as_of}" if args.from_t is None else f"changes in ({args.from_t}, {args.as_of}]"
    if args.out:
        _write_atomically(table, args.out, fmt)
        print(f"wrote {table.num_rows} rows of {args.name} {what} to {args.out}")
    else:
        _write_stdout_csv(table)
    return 0


def cmd_tail(args: argparse.Namespace) -> int:
    """Print the relation's changes as they become durable: CSV lines ``event,time,<columns>,diff``
    (``snapshot`` rows first, then ``update`` rows and ``progress`` lines), until interrupted,
    ``--count`` events, or ``--idle-timeout`` seconds without one."""
    out = csv.writer(sys.stdout, lineterminator="\n")
    with _open(args) as engine:
        names = engine.schema(args.name).names
        out.writerow(["event", "time", *names, "diff"])
        sys.stdout.flush()
        seen = 0
        with engine.subscribe(args.name, args.as_of) as sub:
            while args.count is None or seen < args.count:
                event = sub.next(timeout=args.idle_timeout)
                if event is None:
                    break
                seen += 1
                if event.kind == "progress":
                    out.writerow(["progress", event.time, *([""] * len(names)), ""])
                else:
                    kind = "snapshot" if event.kind == "snapshot" else "update"
                    for row in event.table.to_pylist():
                        when = event.time if kind == "snapshot" else row["time"]
                        out.writerow([kind, when, *(row[n] for n in names), row["diff"]])
                sys.stdout.flush()
    return 0


# --- verify ---------------------------------------------------------------------------------


def _print_report(report: VerifyReport, verbose: bool) -> None:
    """One line per note and problem (each names its file and offset), so scripts can grep them."""
    print(f"checked {len(report.checked)} files")
    if verbose:
        for path in report.checked:
            print(f"  {path}")
    for note in report.notes:
        print(f"note: {_one_line(note)}")
    for problem in report.problems:
        print(f"problem: {_one_line(problem)}")
    problems = len(report.problems)
    print("ok: no problems" if not problems else f"{problems} problem{'s' if problems != 1 else ''} found")


def cmd_verify(args: argparse.Namespace) -> int:
    """Read-only unless ``--repair``: verify is open's recovery run without writing (exit 0
    exactly when the engine would open with nothing acknowledged lost). ``--repair`` keeps
    every record that verifies, reports what was lost (engine/repair.py) and refuses a loss
    of acknowledged records without ``--force``."""
    from sediment.engine.repair import repair_data_dir

    data_dir = _data_dir(args)
    blob_options = {"blob": getattr(args, "blob", None), "s3_endpoint": getattr(args, "s3_endpoint", None)}
    with _progress(args, 0, f"verify {data_dir}", ""):
        report = verify_data_dir(data_dir, **blob_options)
    if getattr(args, "json", False) and not args.repair:
        import json

        print(json.dumps({"ok": report.ok, "problems": report.problems, "notes": report.notes,
                          "wal": [p.to_json() for p in report.wal_findings]}, indent=2, sort_keys=True))
        return 0 if report.ok else 1
    _print_report(report, args.verbose)
    if args.repair and os.path.isdir(data_dir):
        result = repair_data_dir(data_dir, lambda: _open(args, repair=True, compact=False),
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
    elif not report.ok and os.path.isdir(data_dir):
        print("`sediment verify --repair` keeps every record that verifies and reports what is lost "
              "(--force to accept losing acknowledged records)")
    return 0 if report.ok else 1


# --- demo -----------------------------------------------------------------------------------


def cmd_cluster_key(args: argparse.Namespace) -> int:
    """A new random cluster key: start every storage node of a cluster with it
    (``sediment storage-node --cluster-key K``) and create the engine with the same one."""
    import uuid

    print(uuid.uuid4())
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Hands ``args`` (data_dir, rows, progress) to ``sediment.demo.run``; its int result is the exit code."""
    try:
        demo = importlib.import_module("sediment.demo")
    except ModuleNotFoundError as exc:
        if exc.name != "sediment.demo":
            raise
        raise SedimentError("the demo is not part of this build (sediment/demo.py is missing)") from None
    result = demo.run(args)
    return result if isinstance(result, int) else 0


# --- the parser -----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The command line. ``--data-dir`` and ``--progress`` work before or after the subcommand:
    the subcommands' copies default to SUPPRESS so they only override when given."""
    def add_common(p: argparse.ArgumentParser, top: bool) -> None:
        """The global options. Separate actions per parser (parents= would share them, and
        set_defaults on one changes all); documented once, in ``sediment --help``: a subcommand
        accepts them after its name but does not list them again."""
        def default(value: object) -> object:
            return value if top else argparse.SUPPRESS

        def doc(text: str) -> str:
            return text if top else argparse.SUPPRESS

        p.add_argument("--data-dir", default=default(default_dir), metavar="DIR",
                       help=doc(f"the data directory (default $SEDIMENT_DATA_DIR or {DEFAULT_DATA_DIR})"))
        p.add_argument("--blob", default=default(os.environ.get("SEDIMENT_BLOB")), metavar="URI",
                       help=doc("where batches live: file:///path or s3://bucket/prefix (default $SEDIMENT_BLOB "
                                "or <data-dir>/blobs)"))
        p.add_argument("--metadata", default=default(os.environ.get("SEDIMENT_METADATA")), metavar="SPEC",
                       help=doc("where the catalog lives when not in <data-dir>/meta, e.g. "
                                "zk://127.0.0.1:2181/sediment (default $SEDIMENT_METADATA)"))
        p.add_argument("--s3-endpoint", default=default(os.environ.get("AWS_ENDPOINT_URL")), metavar="URL",
                       help=doc("S3 endpoint for an s3:// --blob (default $AWS_ENDPOINT_URL)"))
        p.add_argument("--replicas", default=default(None), metavar="HOST:PORT,...",
                       help=doc("creating an engine: replicate its log on these storage nodes (needs "
                                "--metadata zk://... and --cluster-key; later opens read them from the metadata)"))
        p.add_argument("--cluster-key", default=default(None), metavar="UUID",
                       help=doc("creating a replicated engine: the key its storage nodes were started with "
                                "(`sediment cluster-key` makes one)"))
        p.add_argument("--connect", default=default(None), metavar="URI",
                       help=doc("talk to a served coordinator (sediment serve) at grpc://HOST:PORT or "
                                "grpc+tls://HOST:PORT instead of opening --data-dir"))
        p.add_argument("--token", default=default(None), metavar="T",
                       help=doc("the shared secret: what --connect sends, what serve requires (default "
                                "$SEDIMENT_TOKEN; prefer the variable: a command line is visible to other users)"))
        p.add_argument("--tls-root-certs", default=default(None), metavar="FILE",
                       help=doc("for --connect grpc+tls://...: the CA certificate (PEM) to trust"))
        p.add_argument("--log-level", default=default(os.environ.get("SEDIMENT_LOG_LEVEL", "warning")),
                       choices=LOG_LEVELS, metavar="LEVEL",
                       help=doc(f"log messages at this level and above on stderr: {', '.join(LOG_LEVELS)} "
                                "(default $SEDIMENT_LOG_LEVEL or warning)"))
        p.add_argument("--log-format", default=default("text"), choices=("text", "json"),
                       help=doc("log lines as text, or as one JSON object per line (default text)"))
        p.add_argument("--take-over-blob-prefix", action="store_true", default=default(False),
                       help=doc("make this data directory the owner of a blob prefix another engine owns "
                                "(only once that engine is gone for good)"))
        p.add_argument("--max-wal-backlog", type=_positive_int, default=default(None), metavar="BYTES",
                       help=doc("bytes of WAL not yet compacted beyond which appends wait for compaction "
                                "(default 1 GiB; at least 1 MiB)"))
        bar = p.add_mutually_exclusive_group() if top else p  # argparse cannot format a group of hidden options
        bar.add_argument("--progress", dest="progress", action="store_const", const=True, default=default(None),
                         help=doc("always show progress on stderr (default: only on a terminal)"))
        bar.add_argument("--no-progress", dest="progress", action="store_const", const=False,
                         default=default(None), help=doc("never show progress"))

    default_dir = os.environ.get("SEDIMENT_DATA_DIR", DEFAULT_DATA_DIR)
    parser = _Parser(prog="sediment", description="A write-ahead log plus compacted traces: manage a "
                     "sediment data directory.")
    add_common(parser, top=True)
    parser.add_argument("--version", action="version", version=f"sediment {sediment.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, func: Callable[[argparse.Namespace], int], help_text: str,
                where: argparse._SubParsersAction = sub) -> argparse.ArgumentParser:
        p = where.add_parser(name, help=help_text, description=help_text,
                             epilog="Global options (--data-dir, --connect, --log-level, ...) may also follow the "
                                    "command; `sediment --help` lists them.")
        add_common(p, top=False)
        p.set_defaults(func=func)
        return p

    relation = sub.add_parser("relation", help="add, drop or list relations", description="Add, drop or list "
                              "relations.")
    add_common(relation, top=False)
    rel_sub = relation.add_subparsers(dest="relation_command", required=True, metavar="ACTION")
    p = command("add", cmd_relation_add, "create an empty relation", rel_sub)
    p.add_argument("name", metavar="NAME", help="the new relation's name")
    p.add_argument("--schema", required=True, metavar="SPEC",
                   help="the columns, e.g. 'id:int64,name:string' (time and diff are added)")
    p = command("drop", cmd_relation_drop, "forget a relation and its data", rel_sub)
    p.add_argument("name", metavar="NAME", help="the relation")
    command("list", cmd_relation_list, "list relations: name, schema, since, sealed", rel_sub)

    p = command("append", cmd_append, "append a CSV or Parquet file of updates (all or nothing)")
    p.add_argument("name", metavar="NAME", help="the relation")
    p.add_argument("file", metavar="FILE", help="the relation's columns plus int64 time and diff")
    p.add_argument("--format", choices=FORMATS, help="the file's format (default: from its extension)")
    p.add_argument("--chunk-bytes", type=_positive_int, default=DEFAULT_CHUNK_BYTES, metavar="N",
                   help="CSV block size: the file is checked and appended in chunks of about N bytes")

    p = command("seal", cmd_seal, "close time T: no more updates at times <= T")
    p.add_argument("name", metavar="NAME", help="the relation")
    p.add_argument("t", type=_time_arg, metavar="T", help="a time: an integer in [0, 2**63)")

    p = command("since", cmd_since, "advance the compaction frontier to T (reads below T become impossible)")
    p.add_argument("name", metavar="NAME", help="the relation")
    p.add_argument("t", type=_time_arg, metavar="T", help="a time: an integer in [0, 2**63)")

    p = command("tail", cmd_tail, "print the relation's changes as they become durable (a feed)")
    p.add_argument("name", metavar="NAME", help="the relation")
    p.add_argument("--as-of", type=_time_arg, default=None, metavar="T",
                   help="start with the snapshot at T (default: the sealed frontier)")
    p.add_argument("--count", type=int, default=None, metavar="N", help="stop after N events")
    p.add_argument("--idle-timeout", type=float, default=None, metavar="S",
                   help="stop after S seconds without an event (default: never)")

    p = command("compact", cmd_compact, "turn the WAL into batches, merge them, and trim the WAL now")
    p.add_argument("name", metavar="NAME", nargs="?", default=None, help="only this relation (default: all)")

    p = command("stats", cmd_stats, "show what the engine holds: relations, WAL backlog, compaction lag")
    p.add_argument("--json", action="store_true", help="print the same figures as JSON (as Engine.stats())")

    p = command("read", cmd_read, "print or write the relation as of a time (columns + diff)")
    p.add_argument("name", metavar="NAME", help="the relation")
    p.add_argument("--as-of", type=_time_arg, required=True, metavar="T", help="the time to read the relation at")
    p.add_argument("--from", dest="from_t", type=_time_arg, default=None, metavar="T0",
                   help="print the consolidated changes in (T0, T] instead of the whole relation")
    p.add_argument("--out", metavar="FILE", help="write FILE.csv or FILE.parquet instead of CSV on stdout")
    p.add_argument("--format", choices=FORMATS, help="the output format (default: from --out's extension)")

    p = command("verify", cmd_verify, "check every checksum in the data directory (exit 1 on damage)")
    p.add_argument("--repair", action="store_true", help="cut a damaged log at the damage, then check again")
    p.add_argument("--force", action="store_true", help="with --repair: accept losing acknowledged records")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="list every file checked")

    command("cluster-key", cmd_cluster_key, "print a new cluster key for a set of storage nodes")

    p = command("demo", cmd_demo, "run a demonstration workload")
    p.add_argument("--rows", type=_positive_int, default=1_000_000, metavar="N",
                   help="about how many updates Spark generates and feeds (default 1000000)")

    from sediment.serve import add_serve_parser  # the network coordinator: sediment/serve.py

    add_serve_parser(command)

    from sediment.wal.replication.node.storage_node import (
        add_storage_node_parser,  # a replica of replicated partitions
    )

    add_storage_node_parser(sub)
    return parser


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(f"sediment: error: {code}\n")
    return 2


def _fail(message: str) -> None:
    try:
        sys.stderr.write(f"sediment: error: {message}\n")
        sys.stderr.flush()
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    """Run one command; the exit code (0 ok, 1 operation failed, 2 bad command line).

    The one place errors become messages, so no command needs its own handler and no
    user sees a traceback; ``SEDIMENT_DEBUG=1`` re-raises instead."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors (already printed)
        return _exit_code(exc.code)
    debug = os.environ.get("SEDIMENT_DEBUG", "").strip() not in ("", "0")
    configure_logging(getattr(args, "log_level", "warning"), getattr(args, "log_format", "text"))
    try:
        if getattr(args, "connect", None) and args.command in LOCAL_ONLY:
            raise UsageError(f"`sediment {args.command}` works on the data directory's files, not through "
                             "--connect: run it where the data directory is")
        return args.func(args)
    except UsageError as exc:
        if debug:
            raise
        _fail(_describe(exc))
        return 2
    except BrokenPipeError:  # `sediment read ... | head`: the reader left, nothing to report
        if sys.stdout is sys.__stdout__:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush is quiet too
        return 1
    except KeyboardInterrupt:
        if debug:
            raise
        _fail("interrupted")
        return 130
    except (SedimentError, OSError, ValueError, pa.ArrowException) as exc:
        if debug:
            raise
        _fail(_describe(exc))
        return 1
    except Exception as exc:  # a bug: still one line, with the way to see more
        if debug:
            raise
        _fail(f"internal error: {type(exc).__name__}: {_describe(exc)} (rerun with SEDIMENT_DEBUG=1 for the "
              "traceback, and please report it)")
        return 1


if __name__ == "__main__":
    sys.exit(main())
