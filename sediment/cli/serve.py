"""``sediment serve``: run the engine on a data directory as a network coordinator.

    sediment serve --data-dir DIR --listen 127.0.0.1:8815 [--token T]   (or $SEDIMENT_TOKEN)
                   [--metrics-listen 127.0.0.1:9108]   (Prometheus text at /metrics)

Kept apart from :mod:`sediment.server` so that building the CLI parser does not import
Arrow Flight; the server is imported only when ``serve`` runs. Prints one line,
``serving <data-dir> on grpc://HOST:PORT``, once clients can connect (scripts and
tests wait for it; ``--listen HOST:0`` picks a free port and the line names it), and
serves until SIGTERM or SIGINT. Then it stops listening, lets calls under way finish
(for at most ``--shutdown-grace`` seconds), aborts the transactions clients left open
and closes the engine, exiting 0. A replicated coordinator superseded by a newer one
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
from sediment.cli.common import data_dir_of, open_engine
from sediment.cli.discover import advertised
from sediment.cli.files import UsageError
from sediment.errors import SedimentError

DEFAULT_LISTEN = "127.0.0.1:8815"
DEFAULT_GRACE = 30.0
EXIT_SUPERSEDED = 3
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
        raise argparse.ArgumentTypeError(f"invalid --listen {text!r}: give HOST:PORT, e.g. {DEFAULT_LISTEN}")
    return host, number


def add_serve_parser(command: Callable[..., argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Adds ``serve`` through the CLI's ``command(name, func, help)`` helper (sediment/cli/parser.py)."""
    p = command("serve", cmd_serve, "serve the data directory to clients over Arrow Flight until SIGTERM")
    p.add_argument("--listen", type=_listen_arg, default=_listen_arg(DEFAULT_LISTEN), metavar="HOST:PORT",
                   help=f"where to listen (default {DEFAULT_LISTEN}; port 0 picks a free port)")
    p.add_argument("--shutdown-grace", type=float, default=DEFAULT_GRACE, metavar="SECONDS",
                   help=f"on SIGTERM, how long calls under way may take to finish before they are cut off "
                        f"(default {DEFAULT_GRACE:g})")
    p.add_argument("--tls-cert", default=None, metavar="FILE",
                   help="serve with TLS: the certificate chain (PEM); clients connect to grpc+tls://")
    p.add_argument("--tls-key", default=None, metavar="FILE", help="the private key (PEM) of --tls-cert")
    p.add_argument("--metrics-listen", type=_listen_arg, default=None, metavar="HOST:PORT",
                   help="also serve Prometheus metrics at http://HOST:PORT/metrics (port 0 picks a free one; "
                        "default: no metrics endpoint)")
    p.add_argument("--txn-idle-timeout", type=float, default=600.0, metavar="SECONDS",
                   help="abort a transaction that no call has named for this long: an open transaction "
                        "holds back compaction (default 600; 0 never)")
    p.add_argument("--cluster", default=None, metavar="zk://HOST:PORT/NAME",
                   help="join this cluster of coordinators (`sediment cluster create` records it) and serve "
                        "the partitions assigned to this member; --data-dir holds their local state")
    p.add_argument("--advertise", default=None, metavar="grpc://HOST:PORT",
                   help="with --cluster: the address clients are sent to (default: the address listened on)")
    return p


def _check_port_free(host: str, port: int) -> None:
    """Refuse an address another process listens on. gRPC would only fail once the engine
    is open (and say little); a race with another process binding it in between is still
    caught there."""
    if port == 0:
        return
    try:
        family, kind, proto, _name, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise UsageError(f"--listen {host}:{port}: cannot resolve {host!r} ({exc.strerror}); give an address of "
                         "this machine, e.g. 127.0.0.1") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does: TIME_WAIT is no conflict
        try:
            probe.bind(address)
        except OSError as exc:
            raise SedimentError(f"cannot listen on {host}:{port}: {exc.strerror}; is another process (another "
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
           on_superseded: Callable[[BaseException], object]) -> tuple[Any, Any]:
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
        return engine, SedimentFlightServer(engine, location, token, txn_idle_timeout=args.txn_idle_timeout or None,
                                            tls=tls)
    except BaseException:
        engine.close()
        if fresh:
            remove_tree_durable(data_dir)
        raise


@contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGTERM and SIGINT set ``stop`` inside; the handlers before are restored after."""
    previous = {sig: signal.signal(sig, lambda _sig, _frame: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def cmd_serve(args: argparse.Namespace) -> int:
    """Opens the engine (creating the directory, as a coordinator's first start must), serves,
    and on SIGTERM/SIGINT shuts down in order: no new calls, calls under way finish, open
    transactions are aborted (so they never become visible), the engine closes."""
    from sediment.net.protocol import TOKEN_ENV

    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV)
    if not token:
        raise UsageError(f"serve needs a token: pass --token T or set ${TOKEN_ENV} (clients send the same)")
    if (args.tls_cert is None) != (args.tls_key is None):
        raise UsageError("--tls-cert and --tls-key go together")
    tls = _tls_of(args)
    host, port = args.listen
    _check_port_free(host, port)  # before the engine opens: a first start then leaves no directory behind
    location = f"grpc://[{host}]:{port}" if ":" in host else f"grpc://{host}:{port}"
    stop = threading.Event()
    if args.cluster:
        from sediment.cli.cluster import serve_cluster

        with _stop_on_signals(stop):
            return serve_cluster(args, location, token, tls, stop)
    clean = True
    superseded: list[BaseException] = []
    with _stop_on_signals(stop):
        engine, server = _start(args, location, token, tls, lambda err: (superseded.append(err), stop.set()))
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
            print(f"stopping: {len(server.open_transactions)} open transactions will be aborted",
                  file=sys.stderr, flush=True)
        finally:
            try:
                clean = server.stop(grace=args.shutdown_grace)
                if metrics is not None:
                    metrics.stop()
            finally:
                engine.close()
    print(f"stopped serving {data_dir_of(args)}", flush=True)
    if not clean:
        # the engine is closed and everything acknowledged is durable; what is left are gRPC
        # threads blocked on clients that stopped reading, which would hang the interpreter's exit
        print(f"sediment serve: calls still running after {args.shutdown_grace:g} s were cut off",
              file=sys.stderr, flush=True)
        os._exit(EXIT_SUPERSEDED if superseded else 0)
    return EXIT_SUPERSEDED if superseded else 0
