"""The ``sediment`` command line's parser: global options (before or after the command) and
one sub-parser per command. Building it imports no command's heavy dependencies beyond
the engine's schema helpers; Arrow Flight comes only when ``serve`` runs."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

import sediment
from sediment.cli.arg_types import Given, positive_count, positive_seconds
from sediment.cli.cluster import add_cluster_parser
from sediment.cli.commands import (
    cmd_append,
    cmd_cluster_key,
    cmd_compact,
    cmd_demo,
    cmd_read,
    cmd_relation_add,
    cmd_relation_alter,
    cmd_relation_describe,
    cmd_relation_drop,
    cmd_relation_list,
    cmd_seal,
    cmd_since,
    cmd_stats,
    cmd_tail,
)
from sediment.cli.common import DEFAULT_DATA_DIR
from sediment.cli.files import FORMATS
from sediment.cli.logs import LOG_LEVELS
from sediment.cli.serve import add_serve_parser
from sediment.cli.verify import cmd_verify

DEFAULT_CHUNK_BYTES = 8 << 20  # CSV read block: the unit of an append chunk


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (argparse prints the usage block too)."""

    def error(self, message: str, prog: str | None = None) -> NoReturn:
        sys.stderr.write(f"sediment: error: {message} (see `{prog or self.prog} --help`)\n")
        raise SystemExit(2)

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        """argparse's, but an argument no parser took points to the help of the command it
        followed (``sediment relation list --json``: ``sediment relation list --help``), where
        the options that command does take are listed."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            words = (getattr(parsed, "command", None), getattr(parsed, "relation_command", None))
            self.error(f"unrecognized arguments: {' '.join(extras)}",
                       " ".join([self.prog, *(w for w in words if isinstance(w, str))]))
        return parsed


def _time_arg(text: str) -> int:
    """A time on the command line: an integer in [0, 2**63). Both refusals state the same
    range, so a user who typed ``abc`` is not told less than one who typed ``-3``."""
    try:
        t = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid time {text!r}: not a whole number; a time is an integer in "
                                         "[0, 2**63), such as 2") from None
    if not 0 <= t < 1 << 63:
        raise argparse.ArgumentTypeError(f"invalid time {text!r}: outside [0, 2**63); a time is an integer in that "
                                         "range, such as 2")
    return t


def _seconds_or_never(text: str) -> float | str:
    if text == "never":
        return text
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not math.isfinite(seconds) or seconds < 0:
        raise argparse.ArgumentTypeError(f"invalid time {text!r}: give seconds >= 0 or 'never'")
    return seconds


Command = Callable[..., argparse.ArgumentParser]  # command(name, func, help_text[, where, relation=]) -> its parser


def _add_common(p: argparse.ArgumentParser, top: bool) -> None:
    """The global options. Separate actions per parser (parents= would share them, and
    set_defaults on one changes all); documented once, in ``sediment --help``: a subcommand
    accepts them after its name but does not list them again."""
    default_dir = os.environ.get("SEDIMENT_DATA_DIR", DEFAULT_DATA_DIR)

    def default(value: object) -> object:
        return value if top else argparse.SUPPRESS

    def doc(text: str) -> str:
        return text if top else argparse.SUPPRESS

    plain = (  # flag, default, metavar, help
        ("--data-dir", default_dir, "DIR",
         f"the data directory (default $SEDIMENT_DATA_DIR or {DEFAULT_DATA_DIR})"),
        ("--blob", os.environ.get("SEDIMENT_BLOB"), "URI",
         "where batches live: file:///path or s3://bucket/prefix (default $SEDIMENT_BLOB "
         "or <data-dir>/blobs)"),
        ("--metadata", os.environ.get("SEDIMENT_METADATA"), "SPEC",
         "where the catalog lives when not in <data-dir>/meta, e.g. "
         "zk://127.0.0.1:2181/sediment or s3://bucket/prefix (default $SEDIMENT_METADATA)"),
        ("--s3-endpoint", os.environ.get("AWS_ENDPOINT_URL"), "URL",
         "S3 endpoint for an s3:// --blob or --wal (default $AWS_ENDPOINT_URL)"),
        ("--wal", os.environ.get("SEDIMENT_WAL"), "SPEC",
         "creating an engine: where its log lives, file (default), device:PATH or "
         "s3://bucket/prefix (needs a shared --metadata and --blob; later opens read it from the "
         "metadata) (default $SEDIMENT_WAL)"),
        ("--replicas", None, "HOST:PORT,...",
         "creating an engine: replicate its log on these storage nodes (needs "
         "--metadata zk://... and --cluster-key; later opens read them from the metadata)"),
        ("--cluster-key", None, "UUID",
         "creating a replicated engine (or a ZooKeeper cluster): the key its storage nodes were "
         "started with (`sediment cluster-key` makes one); an S3-only cluster has none"),
        ("--connect", None, "URI",
         "talk to a served coordinator (sediment serve) at grpc://HOST:PORT or "
         "grpc+tls://HOST:PORT instead of opening --data-dir (a bare HOST:PORT means "
         "grpc://HOST:PORT), or to a cluster of coordinators at zk://HOST:PORT/NAME (an S3-only "
         "one: s3://BUCKET/PREFIX?endpoint=URL)"),
        ("--token", None, "T",
         "the shared secret: what --connect sends, what serve requires (default "
         "$SEDIMENT_TOKEN; prefer the variable: a command line is visible to other users)"),
        ("--tls-root-certs", None, "FILE",
         "for --connect grpc+tls://...: the CA certificate (PEM) to trust"),
    )
    for flag, value, metavar, text in plain:
        p.add_argument(flag, action=Given, default=default(value), metavar=metavar, help=doc(text))
    p.add_argument("--log-level", default=default(os.environ.get("SEDIMENT_LOG_LEVEL", "warning")),
                   choices=LOG_LEVELS, metavar="LEVEL",
                   help=doc(f"log messages at this level and above on stderr: {', '.join(LOG_LEVELS)} "
                            "(default $SEDIMENT_LOG_LEVEL or warning)"))
    p.add_argument("--log-format", default=default("text"), choices=("text", "json"),
                   help=doc("log lines as text, or as one JSON object per line (default text)"))
    p.add_argument("--take-over-blob-prefix", action="store_true", default=default(False),
                   help=doc("make this data directory the owner of a blob prefix another engine owns "
                            "(only once that engine is gone for good)"))
    p.add_argument("--max-wal-backlog", type=positive_count, default=default(None), metavar="BYTES",
                   help=doc("bytes of WAL not yet compacted beyond which appends wait for compaction "
                            "(default 1 GiB; at least 1 MiB)"))
    p.add_argument("--major-compaction-quiet", type=_seconds_or_never, default=default(None), metavar="SECONDS",
                   help=doc("seconds a relation with no history left goes without new data before the "
                            "background merges its batches into one (default 10; 'never': only `compact`)"))
    bar = p.add_mutually_exclusive_group() if top else p  # argparse cannot format a group of hidden options
    bar.add_argument("--progress", dest="progress", action="store_const", const=True, default=default(None),
                     help=doc("always show progress on stderr: a bar on a terminal, else a line as each phase "
                              "starts and ends (default: a bar only when stderr is a terminal)"))
    bar.add_argument("--no-progress", dest="progress", action="store_const", const=False,
                     default=default(None), help=doc("never show progress"))


def _command_adder(sub: argparse._SubParsersAction) -> Command:
    """``command(name, func, help_text, where=sub, relation=None)``: a sub-parser that runs
    ``func``, with the global options accepted after the command name too; a command on one
    relation takes its NAME first (``relation``: that argument's help)."""
    def command(name: str, func: Callable[[argparse.Namespace], int], help_text: str,
                where: argparse._SubParsersAction = sub, relation: str | None = None) -> argparse.ArgumentParser:
        p = where.add_parser(name, help=help_text, description=help_text,
                             epilog="Global options (--data-dir, --connect, --log-level, ...) may also follow the "
                                    "command; `sediment --help` lists them.")
        _add_common(p, top=False)
        p.set_defaults(func=func)
        if relation is not None:
            p.add_argument("name", metavar="NAME", help=relation)
        return p

    return command


THE_RELATION = "the relation"
ALL_HELP = "also internal relations (names starting with '_', such as the Spark sink's _spark_sink.<id>)"


def _add_relation_commands(sub: argparse._SubParsersAction, command: Command) -> None:
    relation = sub.add_parser("relation", help="add, drop, alter, describe or list relations",
                              description="Add, drop, alter, describe or list relations.")
    _add_common(relation, top=False)
    rel_sub = relation.add_subparsers(dest="relation_command", required=True, metavar="ACTION")
    p = command("add", cmd_relation_add, "create an empty relation", rel_sub, relation="the new relation's name")
    p.add_argument("--schema", required=True, metavar="SPEC",
                   help="the columns, e.g. 'id:int64,price:decimal(10,2),at:timestamp[us,tz=UTC]' (time and "
                        "diff are added; `relation list` prints the same form)")
    command("drop", cmd_relation_drop, "forget a relation and its data", rel_sub, relation=THE_RELATION)
    p = command("alter", cmd_relation_alter, "change a relation's columns (all changes or none)", rel_sub,
                relation=THE_RELATION)
    p.add_argument("--add", action="append", default=[], metavar="SPEC",
                   help="add columns, nullable, spelled as --schema: 'qty:int32' (repeatable)")
    p.add_argument("--default", action="append", default=[], metavar="COL=VALUE",
                   help="the value an added column reads as in older rows (default: null)")
    p.add_argument("--widen", action="append", default=[], metavar="SPEC",
                   help="widen columns to a type: 'id:int64' (int8->16->32->64, float32->64, decimal precision, "
                        "string/binary to large_)")
    p.add_argument("--rename", action="append", default=[], metavar="OLD=NEW", help="rename a column")
    p.add_argument("--drop", action="append", default=[], metavar="COL", help="drop a column (not the last)")
    p = command("describe", cmd_relation_describe, "a relation's schema, schema version and columns' field ids",
                rel_sub, relation=THE_RELATION)
    p.add_argument("--json", action="store_true", help="print Engine.describe's dictionary as JSON")
    p = command("list", cmd_relation_list, "list relations: name, schema, since, sealed, schema version",
                rel_sub)
    p.add_argument("--all", action="store_true", help=ALL_HELP)


def _add_write_commands(command: Command) -> None:
    p = command("append", cmd_append, "append a CSV or Parquet file of updates (all or nothing)",
                relation=THE_RELATION)
    p.add_argument("file", metavar="FILE", help="the relation's columns plus int64 time and diff")
    p.add_argument("--format", choices=FORMATS, help="the file's format (default: from its extension)")
    p.add_argument("--chunk-bytes", type=positive_count, default=DEFAULT_CHUNK_BYTES, metavar="N",
                   help="CSV block size: the file is checked and appended in chunks of about N bytes")

    p = command("seal", cmd_seal, "close time T: no more updates at times <= T", relation=THE_RELATION)
    p.add_argument("t", type=_time_arg, metavar="T", help="a time: an integer in [0, 2**63)")

    p = command("since", cmd_since, "advance the compaction frontier to T (reads below T become impossible)",
                relation=THE_RELATION)
    p.add_argument("t", type=_time_arg, metavar="T", help="a time: an integer in [0, 2**63)")


def _add_read_commands(command: Command) -> None:
    p = command("tail", cmd_tail, "print the relation's changes as they become durable (a feed)",
                relation=THE_RELATION)
    p.add_argument("--as-of", type=_time_arg, default=None, metavar="T",
                   help="start with the snapshot at T (default: the sealed frontier; on a relation never "
                        "sealed, every update from the start)")
    p.add_argument("--resume", action="store_true",
                   help="with --as-of T: no snapshot, only the changes after T (to go on after a feed ended at "
                        "the progress line of time T)")
    p.add_argument("--count", type=positive_count, default=None, metavar="N",
                   help="stop once N rows (snapshot, update or progress lines) have been printed")
    p.add_argument("--idle-timeout", type=positive_seconds, default=None, metavar="S",
                   help="stop after S seconds without an event (default: never)")

    p = command("compact", cmd_compact, "turn the WAL into batches, merge them, and trim the WAL now")
    p.add_argument("name", metavar="NAME", nargs="?", default=None, help="only this relation (default: all)")

    p = command("stats", cmd_stats, "show what the engine holds: relations, WAL backlog, compaction lag")
    p.add_argument("--json", action="store_true", help="print the same figures as JSON (as Engine.stats())")
    p.add_argument("--all", action="store_true", help=ALL_HELP)

    p = command("read", cmd_read, "print or write the relation as of a time (columns + diff)",
                relation=THE_RELATION)
    p.add_argument("--as-of", type=_time_arg, required=True, metavar="T", help="the time to read the relation at")
    p.add_argument("--from", dest="from_t", type=_time_arg, default=None, metavar="T0",
                   help="print the consolidated changes in (T0, T] instead of the whole relation")
    p.add_argument("--out", metavar="FILE", help="write FILE.csv or FILE.parquet instead of CSV on stdout")
    p.add_argument("--format", choices=FORMATS, help="the output format (default: from --out's extension)")


def _add_admin_commands(command: Command) -> None:
    p = command("verify", cmd_verify, "check every checksum in the data directory (exit 1 on damage)")
    p.add_argument("--repair", action="store_true", help="cut a damaged log at the damage, then check again")
    p.add_argument("--force", action="store_true", help="with --repair: accept losing acknowledged records")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="list every file checked")

    command("cluster-key", cmd_cluster_key, "print a new cluster key for a set of storage nodes")

    p = command("demo", cmd_demo, "run a demonstration workload")
    p.add_argument("--rows", type=positive_count, default=1_000_000, metavar="N",
                   help="about how many updates Spark generates and feeds (default 1000000)")


def build_parser() -> argparse.ArgumentParser:
    """The command line. ``--data-dir`` and ``--progress`` work before or after the subcommand:
    the subcommands' copies default to SUPPRESS so they only override when given."""
    parser = _Parser(prog="sediment", description="A write-ahead log plus compacted traces: manage a "
                     "sediment data directory.")
    _add_common(parser, top=True)
    parser.add_argument("--version", action="version", version=f"sediment {sediment.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    command = _command_adder(sub)
    _add_relation_commands(sub, command)
    _add_write_commands(command)
    _add_read_commands(command)
    _add_admin_commands(command)
    add_serve_parser(command)  # the network coordinator: sediment/cli/serve.py
    add_cluster_parser(sub, command, _add_common)  # a cluster of them: sediment/cli/cluster.py

    from sediment.wal.replication.node.storage_node import (
        add_storage_node_parser,  # a replica of replicated partitions
    )

    add_storage_node_parser(sub)
    return parser
