"""How Flight's bundled gRPC moves bytes in this process: set before its first call.

Why: gRPC's "event engine" (on by default in the gRPC that pyarrow bundles) hands every
message between threads: a poller thread wakes a pool thread, which reads the socket and
wakes the caller through an eventfd, and a pool thread may send for the caller. A client
that waits for each acknowledgement (``Client.append``, durable on return) paid about 6
context switches and 190-230 us of CPU per 1,000-row append that way. With the event engine
off for client channels and the server's listener, gRPC's older polling lets the thread
that waits on a call poll the socket itself: measured here, 1.6 switches and 130-150 us of
client CPU per append, and about 2 fewer switches per append in the server
(docs/benchmarks.md "Appends over the network").

gRPC reads ``GRPC_EXPERIMENTS`` once, at its first use in the process, so :func:`apply`
runs before a client or server is made; after that first use it changes nothing. A
``GRPC_EXPERIMENTS`` already set (even to an empty string, which keeps gRPC's defaults) is
left as it is. The variable stays set, so child processes inherit it.
"""

from __future__ import annotations

import os

EXPERIMENTS_ENV = "GRPC_EXPERIMENTS"
INLINE_POLLING = "-event_engine_client,-event_engine_listener"  # gRPC's own switches, turned off


VERBOSITY_ENV = "GRPC_VERBOSITY"
QUIET = "ERROR"  # gRPC's own log lines on stderr: errors only


def apply() -> bool:
    """Ask gRPC for inline polling unless ``GRPC_EXPERIMENTS`` is already set; whether it did.

    Also quiets gRPC's own logging to errors unless ``GRPC_VERBOSITY`` is set: a TLS handshake
    that failed (a client without the server's CA, a plain client at a TLS server) printed
    "WARNING: All log messages before absl::InitializeLog() ..." and an INFO line in both
    processes, around the client's one-line typed error that says the same."""
    os.environ.setdefault(VERBOSITY_ENV, QUIET)
    if EXPERIMENTS_ENV in os.environ:
        return False
    os.environ[EXPERIMENTS_ENV] = INLINE_POLLING
    return True
