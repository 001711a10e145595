"""What every command shares: where the data directory is, opening the engine (or a served
coordinator's client with ``--connect``), progress displays, and the one-line form of an error."""

from __future__ import annotations

import argparse
import os
import re
from typing import TYPE_CHECKING

import sediment
from sediment.cli.files import UsageError, _one_line
from sediment.errors import DataDirLocked, NotADataDir
from sediment.progress import Progress

if TYPE_CHECKING:
    import pyarrow as pa

DEFAULT_DATA_DIR = "./sediment-data"


def schema_spec(schema: pa.Schema) -> str:
    """The schema as ``--schema`` spells it, so `relation list` output can be fed back."""
    from sediment.engine.schema_text import format_schema

    return format_schema(schema)


# sediment.open's options that the command line spells as flags: the engine's errors name
# the Python option (blob='s3://...'); the CLI's name the flag (--blob s3://...).
CLI_OPTIONS = {"blob": "--blob", "wal": "--wal", "s3_endpoint": "--s3-endpoint", "metadata": "--metadata",
               "replicas": "--replicas", "cluster_key": "--cluster-key",
               "take_over_blob_prefix": "--take-over-blob-prefix", "max_wal_backlog": "--max-wal-backlog",
               "major_compaction_quiet": "--major-compaction-quiet"}
_OPTION_IN_TEXT = re.compile(r"(?<![\w-])(" + "|".join(CLI_OPTIONS) + r")=(\[\.\.\.\]|'[^']*'|\"[^\"]*\"|True\b)?")


def cli_option_names(text: str) -> str:
    """``text`` with each ``option=value`` of :func:`sediment.open` written as the CLI flag."""
    def flag(m: re.Match[str]) -> str:
        name, value = CLI_OPTIONS[m.group(1)], m.group(2)
        if value == "[...]":
            return f"{name} HOST:PORT,..."
        if value and value != "True":
            return f"{name} {value[1:-1]}"
        return name
    return _OPTION_IN_TEXT.sub(flag, text)


def describe(exc: BaseException) -> str:
    """An exception as the one line a user reads, in the command line's own terms."""
    if isinstance(exc, OSError) and exc.strerror:
        where = exc.filename if exc.filename is not None else ""
        text = f"{where}: {exc.strerror}" if where else exc.strerror
    else:
        text = str(exc) or type(exc).__name__
    return cli_option_names(_one_line(text))


def data_dir_of(args: argparse.Namespace) -> str:
    """The data directory, absolute; an empty ``--data-dir`` is refused (``abspath('')`` would
    make the working directory one, as the API refuses an empty path)."""
    if not str(args.data_dir).strip():
        raise UsageError("--data-dir is empty; pass a directory, e.g. --data-dir ./sediment-data")
    return os.path.abspath(os.path.expanduser(args.data_dir))


def require_engine_dir(data_dir: str, *, shared: bool) -> None:
    """What a command that does not create an engine may open, so that it never makes (or
    litters) a directory: one an engine was made in (engine/data_dir.py's layout). With
    ``shared`` (``--metadata``) the engine lives in the shared store, and a new coordinator's
    directory may also be missing or empty (it is made then), but not someone else's: not a
    cluster member's, whose directory holds only its lock (and its ``MEMBER`` record) until its
    first partition opens."""
    from sediment.engine.data_dir import LOCK_NAME, DataDir

    how = "`sediment relation add` creates one, or pass --data-dir"
    if not os.path.isdir(data_dir):
        if shared and not os.path.lexists(data_dir):
            return
        what = "no data directory at" if not os.path.lexists(data_dir) else "not a directory:"
        raise NotADataDir(f"{what} {data_dir}; {how}")
    where = DataDir(data_dir)
    cluster = where.member_of()
    if cluster is not None or os.path.isdir(os.path.join(data_dir, "partitions")):
        raise NotADataDir(f"{data_dir} is a cluster member's directory ({member_what(cluster)}), not an engine's; "
                          f"nothing was changed: reach the cluster with --connect {cluster or 'zk://HOST:PORT/NAME'}")
    if where.holds_engine():
        return
    entries = os.listdir(data_dir)
    if shared and not entries:
        return
    if shared and entries == [LOCK_NAME]:
        raise NotADataDir(f"{data_dir} holds only a LOCK file, as a cluster member's directory can (or one whose "
                          "engine's first open was stopped), so it was left as it is: a member's "
                          "is reached with --connect zk://HOST:PORT/NAME; for a new coordinator pass an empty or new "
                          f"--data-dir, or remove {where.lock} if no member uses it")
    raise NotADataDir(f"{data_dir} is not a sediment data directory (it has none of meta/, wal/, REPLICATED) and "
                      f"was left as it is; {how}")


def member_what(cluster: str | None) -> str:
    """How a member's directory was recognised, for the one-line refusal."""
    return f"a member of {cluster}: its MEMBER record says so" if cluster else "its partitions/ directory"


def require_metadata_dir(spec: str) -> None:
    """A ``--metadata`` that names a local directory (the journal store, as opposed to
    ``zk://``, ``s3://`` or ``memory://``), for a command that does not create an engine: it
    must hold a store already, as opening one would make the directory and an empty store."""
    if "://" in spec:
        return
    from sediment.metadata.journal_format import JOURNAL_NAME, SNAPSHOT_NAME

    path = os.path.abspath(spec)
    if os.path.isdir(path) and any(os.path.lexists(os.path.join(path, n)) for n in (JOURNAL_NAME, SNAPSHOT_NAME)):
        return
    what = ("no metadata directory at" if not os.path.lexists(path) else
            "not a directory:" if not os.path.isdir(path) else "no metadata store in")
    raise NotADataDir(f"--metadata {spec}: {what} {path}, so there is no engine to open; nothing was created. Pass "
                      "the metadata the engine was created with (`sediment relation add` creates one)")


def open_engine(args: argparse.Namespace, *, create: bool = False, discover: bool = True,
                **options: object) -> sediment.Engine:
    """Open the engine; only commands that create things (``create``) may create the data
    directory, the others need one an engine was made in (:func:`require_engine_dir`). With
    ``--connect`` the engine is a served coordinator's, reached through a client that has the
    same methods, so every command reads the same either way. A data directory another
    process serves is used through that server (``discover``: see sediment/cli/discover.py)."""
    if getattr(args, "connect", None):
        token = args.token if getattr(args, "token", None) else os.environ.get("SEDIMENT_TOKEN")
        if not token:
            raise UsageError("--connect needs a token: pass --token T or set $SEDIMENT_TOKEN")
        if not args.connect.startswith(("zk://", "s3://")):
            from sediment.errors import InvalidArgument
            from sediment.net.connect_options import server_location

            try:
                server_location(args.connect)
            except InvalidArgument as exc:  # the flag's value: a bad command line
                raise UsageError(f"--connect: {exc}") from None
        return sediment.connect(args.connect, token=token, tls_root_certs=getattr(args, "tls_root_certs", None))
    data_dir = data_dir_of(args)
    if not create:
        if getattr(args, "metadata", None):
            require_metadata_dir(args.metadata)
        require_engine_dir(data_dir, shared=bool(getattr(args, "metadata", None)))
    given = {option: getattr(args, option, None) for option in ("blob", "metadata", "wal", "cluster_key",
                                                                "take_over_blob_prefix", "max_wal_backlog")}
    for option, value in given.items():
        if value:  # a flag left out (None, False): the engine's default or its recorded storage
            options.setdefault(option, value)
    if given["blob"] or given["wal"]:
        options.setdefault("s3_endpoint", getattr(args, "s3_endpoint", None))
    if getattr(args, "replicas", None):
        options.setdefault("replicas", [r.strip() for r in args.replicas.split(",") if r.strip()])
    quiet = getattr(args, "major_compaction_quiet", None)
    if quiet is not None:
        options.setdefault("major_compaction_quiet", None if quiet == "never" else quiet)
    try:
        return sediment.open(data_dir, **options)
    except DataDirLocked as exc:
        from sediment.cli.discover import connect_instead, named_holder

        if not discover:
            raise named_holder(data_dir, exc) from None
        return connect_instead(args, data_dir, exc)


def progress_for(args: argparse.Namespace, total: int | None, label: str, unit: str) -> Progress:
    force = getattr(args, "progress", None)
    if force is None and getattr(args, "log_format", "text") == "json":
        force = False  # stderr carries JSON log lines only, unless progress is asked for
    return Progress(total, label, unit, force=force)

