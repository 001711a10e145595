"""``sediment serve``: run the engine on a data directory as a network coordinator.

    sediment serve --data-dir DIR --listen 127.0.0.1:8815 [--token T]   (or $SEDIMENT_TOKEN)
                   [--metrics-listen 127.0.0.1:9108]   (Prometheus text at /metrics)

Kept apart from :mod:`sediment.server` so that building the CLI parser does not import
Arrow Flight; the server is imported only when ``serve`` runs. Prints one line,
``serving <data-dir> on grpc://HOST:PORT``, once clients can connect (scripts and
tests wait for it; ``--listen HOST:0`` picks a free port and the line names it), and
serves until SIGTERM or SIGINT. Then it stops listening, lets calls under way finish
(for at most ``--shutdown-grace`` seconds), aborts the transactions clients left open
and closes the engine, exiting 0. An engine that failed (a write whose outcome is unknown,
such as a lost quorum: it refuses reads and writes until reopened) is closed and opened
again in the same way, in this process, every second until it opens, unless another
coordinator took its log on S3 over meanwhile (then it stops as a fenced one does). A replicated
coordinator superseded by a newer one
(fenced) has closed its engine already: serve stops the same way and exits 3, with
the reason on stderr, so a supervisor sees that this process must not simply restart
in place of the new coordinator.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sediment._fs import remove_tree_durable
from sediment.cli.arg_types import given_on_command_line, positive_bytes, seconds
from sediment.cli.common import data_dir_of, open_engine
from sediment.cli.discover import advertised
from sediment.cli.files import UsageError
from sediment.errors import SedimentError
from sediment.wording import counted

DEFAULT_LISTEN = "127.0.0.1:8815"
DEFAULT_GRACE = 30.0
EXIT_SUPERSEDED = 3
REOPEN_EVERY = 1.0  # seconds between attempts to open a failed engine again
FAILED_GRACE = 2.0  # seconds calls under way get once the engine failed (they fail at their next step)
SIGNAL_CHECK = 0.5  # seconds between the main thread's checks for a signal's handler


def _listen_arg(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6); port 0 picks a free one."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not sep or not host or not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"invalid address {text!r}: give HOST:PORT, e.g. {DEFAULT_LISTEN}")
    return host, number


def _advertise_arg(text: str) -> str:
    """``grpc://HOST:PORT`` or ``grpc+tls://HOST:PORT`` (a bare ``HOST:PORT`` is ``grpc://``, as
    for ``--connect``): the address members publish and clients are sent to. Anything else was
    published as given, and every client redirected to that member failed."""
    from urllib.parse import urlsplit

    uri = text if "://" in text else f"grpc://{text}"
    parts = urlsplit(uri)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("grpc", "grpc+tls") or not parts.hostname or not port or parts.path not in ("", "/"):
        raise argparse.ArgumentTypeError(f"invalid --advertise {text!r}: give the address clients reach this "
                                         "member at, grpc://HOST:PORT or grpc+tls://HOST:PORT (a port in 1..65535)")
    return uri.rstrip("/")


def add_serve_parser(command: Callable[..., argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Adds ``serve`` through the CLI's ``command(name, func, help)`` helper (sediment/cli/parser.py)."""
    p = command("serve", cmd_serve, "serve the data directory to clients over Arrow Flight until SIGTERM")
    p.add_argument("--listen", type=_listen_arg, default=_listen_arg(DEFAULT_LISTEN), metavar="HOST:PORT",
                   help=f"where to listen (default {DEFAULT_LISTEN}; port 0 picks a free port)")
    p.add_argument("--shutdown-grace", type=seconds, default=DEFAULT_GRACE, metavar="SECONDS",
                   help=f"on SIGTERM, how long calls under way may take to finish before they are cut off "
                        f"(default {DEFAULT_GRACE:g})")
    p.add_argument("--tls-cert", default=None, metavar="FILE",
                   help="serve with TLS: the certificate chain (PEM); clients connect to grpc+tls://")
    p.add_argument("--tls-key", default=None, metavar="FILE", help="the private key (PEM) of --tls-cert")
    p.add_argument("--metrics-listen", type=_listen_arg, default=None, metavar="HOST:PORT",
                   help="also serve Prometheus metrics at http://HOST:PORT/metrics (port 0 picks a free one; "
                        "default: no metrics endpoint)")
    p.add_argument("--txn-idle-timeout", type=seconds, default=600.0, metavar="SECONDS",
                   help="abort a transaction that no call has named for this long: an open transaction "
                        "holds back compaction (default 600; 0 never)")
    p.add_argument("--max-append-bytes", type=positive_bytes, default=None, metavar="BYTES",
                   help="refuse an append (or a table staged for append_many) whose Arrow buffers pass this "
                        "many bytes: the server holds a whole append before applying it (default 1 GiB)")
    p.add_argument("--cluster", default=None, metavar="zk://HOST:PORT/NAME|s3://BUCKET/PREFIX",
                   help="join this cluster of coordinators (`sediment cluster create` records it; s3://: an "
                        "S3-only cluster, membership by leases) and serve "
                        "the partitions assigned to this member; --data-dir holds their local state. Its storage "
                        "comes from the cluster's record: --metadata, --blob, --s3-endpoint, --wal, --replicas and "
                        "--cluster-key on the command line are refused, exported ($SEDIMENT_BLOB, ...) ignored")
    p.add_argument("--advertise", type=_advertise_arg, default=None, metavar="grpc://HOST:PORT",
                   help="with --cluster: the address clients are sent to (default: the address listened on)")
    return p


def _check_port_free(host: str, port: int, option: str = "--listen") -> None:
    """Refuse an address another process listens on. gRPC (or the metrics' HTTP server) would
    only fail once the engine is open, and say little; a race with another process binding it
    in between is still caught there."""
    if port == 0:
        return
    try:
        family, kind, proto, _name, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise UsageError(f"{option} {host}:{port}: cannot resolve {host!r} ({exc.strerror}); give an address of "
                         "this machine, e.g. 127.0.0.1") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does: TIME_WAIT is no conflict
        try:
            probe.bind(address)
        except OSError as exc:
            where = "" if option == "--listen" else f" ({option})"
            raise SedimentError(f"cannot listen on {host}:{port}{where}: {exc.strerror}; is another process (another "
                                "sediment serve?) using it? pick another port (0 picks a free one)") from None


def _tls_of(args: argparse.Namespace) -> tuple[bytes, bytes] | None:
    """The --tls-cert and --tls-key files, checked before anything is opened: gRPC would
    only say that it did not start."""
    if args.tls_cert is None:
        return None
    from sediment.errors import InvalidArgument
    from sediment.net.tls import check_tls_files

    try:
        return check_tls_files(args.tls_cert, args.tls_key, f"--tls-cert {args.tls_cert}", f"--tls-key {args.tls_key}")
    except InvalidArgument as exc:
        raise UsageError(str(exc)) from None


def _start(args: argparse.Namespace, location: str, token: str, tls: tuple[bytes, bytes] | None,
           on_superseded: Callable[[BaseException], object],
           on_failed: Callable[[BaseException], object] | None = None) -> tuple[Any, Any]:
    """Open the engine and listen: (engine, server). If listening fails, the engine is closed
    again (its lock released) and a data directory this start created is removed, so a
    failed first start leaves nothing behind."""
    from sediment.server import SedimentFlightServer

    data_dir = data_dir_of(args)
    fresh = not os.path.exists(data_dir) and not getattr(args, "metadata", None)
    engine = open_engine(args, create=True, discover=False)
    try:
        listeners = getattr(engine, "superseded_listeners", None)
        if listeners is not None:
            listeners.append(on_superseded)
        if on_failed is not None and getattr(engine, "failed_listeners", None) is not None:
            engine.failed_listeners.append(on_failed)
        return engine, SedimentFlightServer(engine, location, token, txn_idle_timeout=args.txn_idle_timeout or None,
                                            tls=tls, max_append_bytes=args.max_append_bytes)
    except BaseException:
        engine.close()
        if fresh:
            remove_tree_durable(data_dir)
        raise


def _start_again(args: argparse.Namespace, location: str, token: str, tls: tuple[bytes, bytes] | None,
                 on_superseded: Callable[[BaseException], object], on_failed: Callable[[BaseException], object],
                 stop: threading.Event, newer_writer: Callable[[], BaseException | None] | None,
                 superseded: list[BaseException]) -> tuple[Any, Any] | None:
    """After the engine failed (a write of unknown outcome, engine/view.py ``fail``): open it
    again, whose recovery settles the log, every ``REOPEN_EVERY`` seconds until it opens (its
    storage may still be away) or a signal stops serving (None). Clients meanwhile find no
    server (a transport error: they retry). Before each try, ``newer_writer()`` (a log on S3)
    says whether another coordinator took the log over since the failed engine opened: the
    reopen would take it back from that one (a coordinator woken from a pause, whose first
    write had an unknown outcome rather than a refusal, did), so then it is recorded in
    ``superseded`` and serve stops (exit 3); while the look itself fails, no try is made."""
    last = ""
    while not stop.is_set():
        try:
            newer = newer_writer() if newer_writer is not None else None
            if newer is not None:
                print(f"sediment serve: {newer}", file=sys.stderr, flush=True)
                superseded.append(newer)
                return None
            return _start(args, location, token, tls, on_superseded, on_failed)
        except SedimentError as exc:
            if str(exc) != last:
                print(f"sediment serve: opening the engine again failed ({type(exc).__name__}: {exc}); retrying "
                      f"every {REOPEN_EVERY:g} s", file=sys.stderr, flush=True)
                last = str(exc)
        stop.wait(REOPEN_EVERY)
    return None


class _SignalSafeEvent(threading.Event):
    """An Event a signal handler may set. Python runs the handler in the main thread between
    two bytecodes, possibly while that thread holds the event's lock (``Event.wait`` re-takes
    it after each timed wake): with the plain lock, ``set`` then waited for its own thread
    forever and serve ignored SIGTERM. A reentrant lock lets the handler in."""

    def __init__(self) -> None:
        super().__init__()
        self._cond = threading.Condition(threading.RLock())


@contextmanager
def _stop_on_signals() -> Iterator[tuple[threading.Event, threading.Event]]:
    """``(stop, signalled)``: SIGTERM and SIGINT set both inside (others may set ``stop``);
    the handlers before are restored after."""
    stop, signalled = _SignalSafeEvent(), _SignalSafeEvent()

    def handler(_sig: int, _frame: object) -> None:
        signalled.set()
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop, signalled
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _serve_until_stopped(args: argparse.Namespace, engine: Any, server: Any, stop: threading.Event,
                         superseded: list[BaseException], failed: list[BaseException]) -> bool:
    """Serve until ``stop`` (a signal, a fencing, a failed engine), then stop listening (calls
    under way finish for at most the grace; after a failure at most ``FAILED_GRACE``: they
    fail anyway) and close the engine; False when calls were still running after the grace."""
    metrics = None
    try:
        if args.metrics_listen is not None:
            from sediment.metrics import MetricsServer

            metrics = MetricsServer(engine.metrics, *args.metrics_listen)
            print(f"metrics on {metrics.url}", flush=True)
        with advertised(engine.data_dir, server.uri):  # other commands find it (cli/discover.py)
            print(f"serving {data_dir_of(args)} on {server.uri}", flush=True)
            # a signal handler (run by this thread) or a fencing sets it; the wait wakes up every
            # half second because a SIGTERM delivered to one of gRPC's threads does not interrupt
            # this thread's lock wait, and Python runs the handler only once this thread runs
            while not stop.wait(SIGNAL_CHECK):
                pass
        if superseded:
            print(f"sediment serve: {superseded[0]}", file=sys.stderr, flush=True)
        print(f"stopping: {counted(len(server.open_transactions), 'open transaction')} will be aborted",
              file=sys.stderr, flush=True)
    finally:
        try:
            clean = server.stop(grace=min(args.shutdown_grace, FAILED_GRACE) if failed else args.shutdown_grace)
            if metrics is not None:
                metrics.stop()
        finally:
            engine.close()
    return clean


def _newer_writer_check(engine: Any) -> Callable[[], BaseException | None] | None:
    """How to ask, once ``engine`` failed, whether another coordinator took its log over
    (None: its log cannot be taken over from elsewhere, or is told so: ZooKeeper's watch)."""
    make = getattr(getattr(getattr(engine, "storage", None), "log", None), "newer_writer_check", None)
    return make() if make is not None else None


# a cluster member's storage, all from the cluster's record: (flag, dest)
MEMBER_STORAGE = (("--metadata", "metadata"), ("--blob", "blob"), ("--s3-endpoint", "s3_endpoint"), ("--wal", "wal"),
                  ("--replicas", "replicas"), ("--cluster-key", "cluster_key"))
# options of the one engine a plain serve opens, which a member's partitions do not take: (flag, dest)
ENGINE_ONLY = (("--take-over-blob-prefix", "take_over_blob_prefix"), ("--max-wal-backlog", "max_wal_backlog"),
               ("--major-compaction-quiet", "major_compaction_quiet"))


def _refuse_member_storage_options(args: argparse.Namespace) -> None:
    """A member takes its metadata, blob store, S3 endpoint, storage nodes and key from the
    cluster's record, so these options were silently ignored. Refused when typed on the
    command line only: exported ($SEDIMENT_BLOB, ...) for the shell's other commands, they are
    ignored, as refusing them would make a member unstartable from that shell."""
    typed = [flag for flag, dest in MEMBER_STORAGE if given_on_command_line(args, dest)]
    if typed:
        raise UsageError(f"{' and '.join(typed)}: a cluster member takes its storage (metadata, blob store, S3 "
                         "endpoint, storage nodes, cluster key) from the cluster's record (`sediment cluster create` "
                         "wrote it); leave them out of serve --cluster (nothing was started)")
    unused = [flag for flag, dest in ENGINE_ONLY if getattr(args, dest, None) not in (None, False)]
    if unused:
        raise UsageError(f"{' and '.join(unused)}: serve --cluster opens its partitions' engines with the defaults, "
                         "so this would be ignored; leave it out (nothing was started)")


def cmd_serve(args: argparse.Namespace) -> int:
    """Opens the engine (creating the directory, as a coordinator's first start must), serves,
    and on SIGTERM/SIGINT shuts down in order: no new calls, calls under way finish, open
    transactions are aborted (so they never become visible), the engine closes."""
    from sediment.net.protocol import TOKEN_ENV

    if args.advertise is not None and not args.cluster:
        raise UsageError(f"--advertise {args.advertise} is the address of a cluster member: give it with "
                         "--cluster zk://HOST:PORT/NAME (or s3://BUCKET/PREFIX), or leave it out")
    if args.cluster:
        _refuse_member_storage_options(args)
    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV)
    if not token:
        raise UsageError(f"serve needs a token: pass --token T or set ${TOKEN_ENV} (clients send the same)")
    if (args.tls_cert is None) != (args.tls_key is None):
        raise UsageError("--tls-cert and --tls-key go together")
    tls = _tls_of(args)
    host, port = args.listen
    _check_port_free(host, port)  # before the engine opens: a first start then leaves no directory behind
    if args.metrics_listen is not None:
        _check_port_free(*args.metrics_listen, option="--metrics-listen")
    location = f"grpc://[{host}]:{port}" if ":" in host else f"grpc://{host}:{port}"
    if args.cluster:
        from sediment.cli.cluster import serve_cluster

        with _stop_on_signals() as (stop, _signalled):
            return serve_cluster(args, location, token, tls, stop)
    clean = True
    superseded: list[BaseException] = []
    failed: list[BaseException] = []

    def on_superseded(err: BaseException) -> None:
        superseded.append(err)
        stop.set()

    def on_failed(err: BaseException) -> None:
        failed.append(err)
        stop.set()

    with _stop_on_signals() as (stop, signalled):
        started: tuple[Any, Any] | None = _start(args, location, token, tls, on_superseded, on_failed)
        while started is not None:
            engine, server = started
            newer_writer = _newer_writer_check(engine)
            clean = _serve_until_stopped(args, engine, server, stop, superseded, failed)
            started = None
            location = server.uri  # the port it bound (--listen HOST:0 picked one): clients come back there
            if failed and not superseded and not signalled.is_set():
                print(f"sediment serve: {failed[0]}; opening it again", file=sys.stderr, flush=True)
                failed.clear()
                stop.clear()
                if signalled.is_set():  # a signal between the check and the clear
                    stop.set()
                started = _start_again(args, location, token, tls, on_superseded, on_failed, stop, newer_writer,
                                       superseded)
    print(f"stopped serving {data_dir_of(args)}", flush=True)
    if not clean:
        # the engine is closed and everything acknowledged is durable; what is left are gRPC
        # threads blocked on clients that stopped reading, which would hang the interpreter's exit
        print(f"sediment serve: calls still running after {args.shutdown_grace:g} s were cut off",
              file=sys.stderr, flush=True)
        os._exit(EXIT_SUPERSEDED if superseded else 0)
    return EXIT_SUPERSEDED if superseded else 0
