"""The commands that read or change an engine: relations, append, seal, since, compact,
stats, read, tail; and cluster-key and demo. Each takes the parsed arguments and returns
the exit code; errors are left to :func:`sediment.cli.app.main`, the one place they
become messages."""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib
import json
import os
import shlex
import sys
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sediment.cli.arg_types import given_on_command_line
from sediment.cli.common import data_dir_of, open_engine, progress_for, schema_spec
from sediment.cli.discover import shared
from sediment.cli.files import (
    InputError,
    UsageError,
    _csv_chunks,
    _difference,
    _file_format,
    _input_size,
    _parquet_chunks,
    _print_stats,
    _write_atomically,
    _write_stdout_csv,
    check_csv_writable,
    check_output_path,
    csv_text,
)
from sediment.engine.schema import check_name, conform_updates, update_schema
from sediment.engine.schema_text import parse_schema_spec
from sediment.errors import AsOfOutOfRange, EngineClosed, SchemaMismatch, SedimentError, TimeAlreadySealed
from sediment.wording import counted

KEEP_VALIDATED_BYTES = 256 << 20  # below this, the checked chunks are appended without reading the file again


def cmd_relation_add(args: argparse.Namespace) -> int:
    """Checks the name and schema before opening, so a bad command creates no directory. A
    --schema that does not parse is a malformed command line (exit code 2)."""
    check_name(args.name)
    try:
        schema = parse_schema_spec(args.schema)
    except SchemaMismatch as exc:
        raise UsageError(f"--schema: {exc}") from None
    with open_engine(args, create=True) as engine:
        engine.add_relation(args.name, schema)
    print(f"added relation {args.name} ({schema_spec(schema)})")
    return 0


def cmd_relation_drop(args: argparse.Namespace) -> int:
    """The relation's WAL records stay until the log is trimmed, but are ignored from now on."""
    check_name(args.name)
    with open_engine(args) as engine:
        engine.drop_relation(args.name)
    print(f"dropped relation {args.name}")
    return 0


def cmd_relation_alter(args: argparse.Namespace) -> int:
    """All the flags make one alter: every change or none (engine/schema_rules.py says which
    are allowed). Flags that do not parse are a malformed command line (exit code 2)."""
    check_name(args.name)
    changes = alter_changes(args)
    with open_engine(args) as engine:
        before = engine.schema_version(args.name)
        version = engine.alter_relation(args.name, **changes)
        schema = engine.schema(args.name)
    done = "altered relation" if version != before else "nothing to change in relation"
    print(f"{done} {args.name}: schema version {version} ({schema_spec(schema)})")
    return 0


def alter_changes(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of ``alter_relation`` from ``relation alter``'s flags: ``--add`` and
    ``--widen`` in the ``--schema`` spelling, ``--rename OLD=NEW``, ``--drop COL``,
    ``--default COL=VALUE`` (the text cast to the added column's type)."""
    def pairs(flag: str, items: list[str]) -> dict[str, str]:
        bad = [i for i in items if "=" not in i or not i.split("=", 1)[0]]
        if bad:
            raise UsageError(f"{flag} takes NAME=VALUE, not {bad[0]!r}")
        return once(flag, [tuple(i.split("=", 1)) for i in items])

    def once(flag: str, items: list[tuple[str, Any]]) -> dict[str, Any]:
        """A column named twice was resolved silently (the last one won): which was meant is
        the caller's to say."""
        seen: dict[str, Any] = {}
        for name, value in items:
            if name in seen:
                raise UsageError(f"{flag} names column {name!r} twice; give it once (nothing was changed)")
            seen[name] = value
        return seen

    try:
        add = [f for spec in args.add for f in parse_schema_spec(spec)]
        widen = once("--widen", [(f.name, f.type) for spec in args.widen for f in parse_schema_spec(spec)])
    except SchemaMismatch as exc:
        raise UsageError(f"--add/--widen: {exc}") from None
    types = {f.name: f.type for f in add}
    defaults: dict[str, Any] = {}
    for name, text in pairs("--default", args.default).items():
        try:
            defaults[name] = pa.scalar(text).cast(types[name]).as_py() if name in types else text
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise UsageError(f"--default {name}={text}: not a {types[name]}: {exc}") from None
    if not (add or widen or args.rename or args.drop):
        raise UsageError("relation alter needs at least one of --add, --widen, --rename, --drop")
    return {"add": add, "widen": widen, "rename": pairs("--rename", args.rename), "drop": list(args.drop),
            "defaults": defaults}


def cmd_relation_describe(args: argparse.Namespace) -> int:
    """The relation's schema and version, then one tab-separated line per column: name, type,
    field id, then ``required`` for a column every append must give (one the relation was
    created with) or the default an added one reads as (``--json``: Engine.describe's dictionary)."""
    check_name(args.name)
    with open_engine(args) as engine:
        info = engine.describe(args.name)
    if args.json:
        print(json.dumps(info, sort_keys=True))
        return 0
    print(f"{info['name']}\t{info['schema']}\tschema_version={info['schema_version']}\tsince={info['since']}"
          f"\tsealed={info['sealed']}")
    for col in info["columns"]:
        default = "" if col["default"] is None else f"\tdefault={col['default']}"
        required = "\trequired" if col["required"] else ""
        print(f"  {col['name']}\t{col['type']}\tfield_id={col['field_id']}{required}{default}")
    return 0


def cmd_relation_list(args: argparse.Namespace) -> int:
    """One line per relation, tab-separated: name, schema (as --schema spells it), since, sealed,
    schema version; internal relations only with --all."""
    with open_engine(args) as engine:
        rows = [(name, schema_spec(engine.schema(name)), engine.since(name), engine.sealed(name),
                 engine.schema_version(name)) for name in engine.relations(include_internal=args.all)]
    for name, spec, since, sealed, version in rows:
        print(f"{name}\t{spec}\tsince={since}\tsealed={sealed}\tschema_version={version}")
    if not rows:
        print(f"no relations in {data_dir_of(args)}", file=sys.stderr)
    return 0


# --- append ---------------------------------------------------------------------------------


def cmd_append(args: argparse.Namespace) -> int:
    """Two passes so that bad input never touches the log: first every chunk is parsed and
    checked against the relation (types, nulls, negative or sealed times), then the chunks
    go into one transaction, committed at the end, so the file lands whole or not at all.
    As ``append`` does, a file may leave out columns an alter added (``describe`` marks them
    not required): the engine fills them with their default, null unless one was given."""
    path = args.file
    fmt = _file_format(path, args.format, "input file")
    if not os.path.isfile(path):
        if os.path.exists(path):
            raise InputError(f"{path}: not a regular file")
        raise InputError(f"{path}: no such file")
    check_name(args.name)
    with open_engine(args) as engine:
        schema = engine.schema(args.name)
        target = update_schema(schema)
        optional = {c["name"] for c in engine.describe(args.name)["columns"] if not c["required"]}
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
        with progress_for(args, total, f"check {os.path.basename(path)}", unit) as bar:
            for chunk, position in chunks():
                try:
                    given = _given_columns(args.name, target, optional, chunk)
                    table, _bounds = conform_updates(args.name, schema, chunk, given)
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
            with progress_for(args, rows, f"append {os.path.basename(path)}", "rows") as bar:
                for table in again:
                    if table.num_rows:
                        txn.append(args.name, table)
                        bar.update(table.num_rows)
            txn.commit()
        except BaseException:
            with contextlib.suppress(Exception):  # report the first failure, not the abort's
                txn.abort()
            raise
    print(f"appended {counted(rows, 'row')} to {args.name} from {path} (times {t_lo}..{t_hi})")
    return 0


def _given_columns(name: str, target: pa.Schema, optional: set[str], chunk: pa.Table) -> pa.Schema:
    """The update schema a chunk of an input file is checked against: ``target`` without the
    ``optional`` columns (added by an alter) that the file leaves out, which the engine's
    append fills; SchemaMismatch naming both kinds when it also leaves out a required one."""
    have = set(chunk.column_names)
    may = sorted(n for n in optional if n not in have)
    if not may:
        return target
    lacking = [n for n in target.names if n not in have and n not in optional and n not in ("time", "diff")]
    if lacking:
        raise SchemaMismatch(f"updates for {name!r} do not match its schema: missing {lacking}; expected columns "
                             f"{target.names}, of which {may} may be left out (added by an alter: they read as "
                             "their default)")
    return pa.schema([f for f in target if f.name not in may])


# --- frontiers ------------------------------------------------------------------------------


def cmd_seal(args: argparse.Namespace) -> int:
    """Promise no more updates at times <= T, which makes reads as of T possible."""
    return _move_frontier(args, "seal", f"sealed {args.name} through time {args.t}")


def cmd_since(args: argparse.Namespace) -> int:
    """Let history below T be consolidated away (reads below T become impossible)."""
    return _move_frontier(args, "set_since", f"since of {args.name} is now {args.t}")


def _move_frontier(args: argparse.Namespace, method: str, done: str) -> int:
    with open_engine(args) as engine:
        getattr(engine, method)(args.name, args.t)
    print(done)
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    """Run one full compaction pass and wait for it (the background compacter does the same)."""
    with open_engine(args) as engine:
        names = [args.name] if args.name else engine.relations()
        before = {n: engine.trace_info(n) for n in names}
        with progress_for(args, 0, "compact " + (args.name or counted(len(names), "relation")), ""):
            engine.compact(args.name)
        for n in names:
            info = engine.trace_info(n)
            print(f"compacted {n}: {counted(info['batches'], 'batch')}, {counted(info['rows'], 'row')}, upper "
                  f"{info['upper']}, {counted(info['tail_records'], 'WAL record')} left (was "
                  f"{before[n]['tail_records']})")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    """What the engine holds: per relation rows, batches, bytes, frontiers, WAL tail and
    compaction lag; the WAL's size and backlog; where the storage lives."""
    with open_engine(args) as engine:
        stats = engine.stats(include_internal=args.all)
    if args.json:
        print(json.dumps(stats, indent=2, sort_keys=True))
    else:
        _print_stats(stats)
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
    if args.out:
        check_output_path(args.out)
    what = f"as of {args.as_of}" if args.from_t is None else f"changes in ({args.from_t}, {args.as_of}]"
    with open_engine(args) as engine, progress_for(args, 0, f"read {args.name} {what}", "rows") as bar:
        table = _snapshot_for(engine, args.name, args.as_of, "--as-of")
        if args.from_t is not None:
            table = _difference(table, _snapshot_for(engine, args.name, args.from_t, "--from"))
        bar.update(table.num_rows)
    if fmt == "csv":
        check_csv_writable(table, args.name)
    if args.out:
        _write_atomically(table, args.out, fmt)
        print(f"wrote {counted(table.num_rows, 'row')} of {args.name} {what} to {args.out}")
    else:
        _write_stdout_csv(table)
    return 0


def _snapshot_for(engine: Any, name: str, t: int, flag: str) -> pa.Table:
    """The snapshot at ``t``; a time out of range names the flag that gave it."""
    with _flag_named(t, flag):
        return engine.snapshot(name, t)


@contextlib.contextmanager
def _flag_named(t: int, flag: str) -> Iterator[None]:
    """The engine's AsOfOutOfRange says ``as_of T``, for ``--as-of`` and ``--from`` alike: the
    command line's says which flag gave the time."""
    try:
        yield
    except AsOfOutOfRange as exc:
        text, api = str(exc), f"as_of {t}"
        raise AsOfOutOfRange(f"{flag} {t}{text[len(api):]}" if text.startswith(api) else f"{flag} {t}: {text}") \
            from None


def _tail_rows(event: Any, names: list[str], relation: str) -> Iterator[list[object]]:
    """The CSV rows of one feed event: one per update, one ``progress`` row per progress event;
    values as ``sediment read`` prints them (:func:`csv_text`)."""
    if event.kind == "progress":
        yield ["progress", event.time, *([""] * len(names)), ""]
        return
    if event.kind == "schema":  # a header row for what follows: the new schema version, then the columns
        yield ["schema", event.time, *names, "diff"]
        return
    kind = "snapshot" if event.kind == "snapshot" else "update"
    for row in csv_text(event.table, relation).to_pylist():
        yield [kind, event.time if kind == "snapshot" else row["time"], *(row[n] for n in names), row["diff"]]


def cmd_tail(args: argparse.Namespace) -> int:
    """Print the relation's changes as they become durable: CSV lines ``event,time,<columns>,diff``
    (``snapshot`` rows first, then ``update`` rows and ``progress`` lines; after an alter, a
    ``schema,<version>,<new columns>,diff`` line and rows in the new columns), until interrupted,
    ``--count`` rows have been printed (the header aside), or ``--idle-timeout`` seconds pass
    without an event. If the feed ends (its server stopped), the error names the command
    that goes on from the last progress line printed."""
    out = csv.writer(sys.stdout, lineterminator="\n")
    printed = 0
    with open_engine(args) as engine, shared(engine, args):  # other commands work through it meanwhile
        names = engine.schema(args.name).names
        done: tuple[str, int] | None = None  # the last snapshot or progress line printed whole: where to go on
        with _flag_named(args.as_of, "--as-of"):
            sub = engine.subscribe(args.name, args.as_of, resume=args.resume)
        with sub:  # refused: no header printed
            out.writerow(["event", "time", *names, "diff"])
            sys.stdout.flush()
            while args.count is None or printed < args.count:
                try:
                    event = sub.next(timeout=args.idle_timeout)
                except EngineClosed:
                    raise EngineClosed(_tail_ended(args, done)) from None
                if event is None:
                    break
                if event.kind == "schema":  # the columns change: say so in order, then go on in the new ones
                    names = [n for n in event.table.column_names if n not in ("time", "diff")]
                for row in _tail_rows(event, names, args.name):
                    out.writerow(row)
                    printed += 1
                    if printed == args.count:
                        break
                sys.stdout.flush()
                if event.kind in ("snapshot", "progress") and event.time >= 0:
                    done = (event.kind, event.time)
    return 0


def _tail_ended(args: argparse.Namespace, done: tuple[str, int] | None) -> str:
    """A snapshot printed whole holds everything through its time, as a progress line does: a
    feed that ended after one goes on from there, not with the whole relation again. The
    command named reaches the same engine: with the ``--connect`` (or ``--data-dir``) and
    ``--tls-root-certs`` given, never the token, so it can be pasted as it is."""
    name = args.name
    flags = (("--connect", "connect"), ("--data-dir", "data_dir"), ("--tls-root-certs", "tls_root_certs"))
    where = [f"{flag} {shlex.quote(str(getattr(args, dest)))}" for flag, dest in flags
             if given_on_command_line(args, dest) and not (dest == "data_dir" and getattr(args, "connect", None))]
    command = " ".join(["sediment", *where, "tail", shlex.quote(name)])
    if done is None:
        again = f"run `{command}` again"
    else:
        kind, t = done
        line = "progress line" if kind == "progress" else "snapshot"
        again = f"`{command} --as-of {t} --resume` goes on after the last {line} printed (time {t})"
    return f"the feed of {name} ended because its engine or server stopped; {again}"


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
