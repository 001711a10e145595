"""Finding the server of a data directory, so that one process holding it does not lock
every other command out.

Only one process may open a data directory (its ``LOCK``): that is what keeps one writer.
A process that serves the directory (``sediment serve``, or a local ``sediment tail``)
records where it listens in ``SERVER`` beside the lock: versioned JSON written atomically
(a temporary file, fsync, rename, fsync of the directory), readable by its owner only,
removed when the server stops. A command that finds the directory locked reads the record
and, when the process is alive and the address answers, works through that server as
``--connect`` would, saying so on stderr. A record whose process is gone or whose address
does not answer is stale and ignored (a killed server leaves one; the next one replaces it).

The token is ``--token``, else the record's own (only a ``tail`` that serves without a
token given makes one up and records it; whoever can read the record can read the data
directory's files anyway), else ``$SEDIMENT_TOKEN``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlparse

from sediment._fs import fsync_dir, replace_durably
from sediment.cli.files import UsageError
from sediment.engine.data_dir import SERVER_FORMAT, SERVER_NAME, SERVER_VERSION, pid_alive, read_server_record
from sediment.errors import DataDirLocked
from sediment.net.protocol import TOKEN_ENV

SERVER_FILE = SERVER_NAME
FORMAT, VERSION = SERVER_FORMAT, SERVER_VERSION
ANSWER_TIMEOUT = 2.0  # seconds for a recorded address to accept a connection


def record_path(data_dir: str) -> str:
    return os.path.join(data_dir, SERVER_FILE)


def write_record(data_dir: str, uri: str, token: str | None = None) -> None:
    """Record that this process serves ``data_dir`` on ``uri`` (durably, atomically)."""
    record: dict[str, Any] = {"format": FORMAT, "version": VERSION, "pid": os.getpid(), "uri": uri}
    if token is not None:
        record["token"] = token
    replace_durably(record_path(data_dir), json.dumps(record, sort_keys=True).encode() + b"\n", 0o600)


def remove_record(data_dir: str) -> None:
    """Remove this process's record (another process's is left alone)."""
    found = read_record(data_dir)
    if found is None or found.get("pid") != os.getpid():
        return
    try:
        os.remove(record_path(data_dir))
    except FileNotFoundError:
        return
    fsync_dir(data_dir)


@contextmanager
def advertised(data_dir: str, uri: str, token: str | None = None) -> Iterator[None]:
    """The record exists while the block runs."""
    write_record(data_dir, uri, token)
    try:
        yield
    finally:
        remove_record(data_dir)


def read_record(data_dir: str) -> dict[str, Any] | None:
    """The record as written, or None if there is none or it is not one this version reads."""
    return read_server_record(data_dir)


def _answers(uri: str) -> bool:
    parsed = urlparse(uri)
    if not parsed.hostname or parsed.port is None:
        return False
    try:
        with socket.create_connection((parsed.hostname, parsed.port), timeout=ANSWER_TIMEOUT):
            return True
    except OSError:
        return False


def live_server(data_dir: str) -> dict[str, Any] | None:
    """The record of a server of ``data_dir`` that is running now, or None (none, or stale)."""
    record = read_record(data_dir)
    if record is None or not pid_alive(record["pid"]) or not _answers(record["uri"]):
        return None
    return record


def named_holder(data_dir: str, locked: DataDirLocked) -> DataDirLocked:
    """``locked``, naming the process that serves the directory when one does (for commands
    that need the directory itself: serve, verify --repair)."""
    record = live_server(data_dir)
    if record is None:
        return locked
    return DataDirLocked(f"{data_dir} is held by process {record['pid']}, which serves it on {record['uri']}; "
                         "stop that process first, or use the directory through it")


def connect_instead(args: argparse.Namespace, data_dir: str, locked: DataDirLocked) -> Any:
    """For a command that found ``data_dir`` locked: a client of the process serving it,
    or ``locked`` raised again when no live server is recorded."""
    record = live_server(data_dir)
    if record is None:
        raise locked
    import sediment

    token = getattr(args, "token", None) or record.get("token") or os.environ.get(TOKEN_ENV)
    where = f"{data_dir} is served by process {record['pid']} on {record['uri']}"
    if not token:
        raise UsageError(f"{where}: pass --token T or set ${TOKEN_ENV} (the server's token) to use it")
    client = sediment.connect(record["uri"], token=token, tls_root_certs=getattr(args, "tls_root_certs", None))
    if client.data_dir and os.path.realpath(client.data_dir) != os.path.realpath(data_dir):
        client.close()  # the record's process and port were both reused: not this directory's server
        raise locked
    print(f"sediment: {where}: using it", file=sys.stderr, flush=True)
    return client


@contextmanager
def shared(engine: Any, args: argparse.Namespace) -> Iterator[None]:
    """While a long-running command (``tail``) holds a data directory's engine, serve it on a
    free loopback port and record that, so other commands work through it instead of
    failing on the lock. Nothing to do for a client (the directory is someone else's)."""
    from sediment.engine.engine import Engine

    if not isinstance(engine, Engine):
        yield
        return
    from sediment.server import SedimentFlightServer

    given = getattr(args, "token", None) or os.environ.get(TOKEN_ENV)
    token = given or secrets.token_hex(16)
    server = SedimentFlightServer(engine, "grpc://127.0.0.1:0", token)
    try:
        with advertised(engine.data_dir, server.uri, None if given else token):
            yield
    finally:
        server.stop(grace=1.0)
