"""Storage nodes as real processes on 127.0.0.1 and the helpers the replication tests share:
the cluster key, a node started and killed by its PID, a record, a wait on the coordinator."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

from sediment.wal import record as rec
from sediment.wal.replication.replicated_log import ReplicatedLog

KEY = uuid.UUID("5e5e5e5e-0000-4000-8000-000000000001")
# A coordinator process: opens the engine at argv[1] with the JSON options of argv[2] and prints
# each time it has appended and sealed, until it is killed.
COORDINATOR = """
import json, sys, pyarrow as pa, sediment
options = json.loads(sys.argv[2])
eng = sediment.open(sys.argv[1], **options)
if "r" not in eng.relations():
    eng.add_relation("r", pa.schema([("k", pa.int64())]))
t = eng.sealed("r") + 1
while True:
    eng.append("r", pa.table({"k": [t], "time": [t], "diff": [1]}))
    eng.seal("r", t)
    print(t, flush=True)
    t += 1
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(log: ReplicatedLog, predicate, timeout: float = 20.0, what: str = "condition") -> None:
    """Wait for ``predicate`` over the coordinator's state, re-checked on each change."""
    assert log.wait_for(predicate, timeout), (f"no {what} within {timeout}s (the coordinator: fenced "
                                              f"{log.coordinator.fenced}, replicas {log.replica_lag()})")


class Node:
    """A storage node subprocess (``python -m sediment.wal.replication.node.storage_node``)."""

    def __init__(self, directory: Path, key: uuid.UUID = KEY, extra_args: tuple[str, ...] = ()) -> None:
        self.dir = directory
        self.extra_args = extra_args
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.key = key
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sediment.wal.replication.node.storage_node", "--dir", str(self.dir), "--listen", self.address,
             "--cluster-key", str(self.key), *self.extra_args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line.startswith("listening on"), f"node did not start: {line!r} {self.proc.stderr.read()}"

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.proc = None

    def records(self, partition: int = 0) -> list[bytes]:
        """The record bodies on disk, read with the segment scanner (node must be stopped or idle)."""
        from sediment.wal import segment as sg
        pdir = self.dir / str(partition)
        out: list[bytes] = []
        for name in sorted(os.listdir(pdir)):
            parsed = sg.parse_name(name)
            if parsed and parsed[1] == "seg":
                data = memoryview((pdir / name).read_bytes())
                for off in sg.scan_segment(str(pdir / name), parsed[0]).offsets:
                    u, _why = rec.check_frame(data, off)
                    out.append(bytes(data[off + rec.HEADER_SIZE:off + rec.HEADER_SIZE + u[4]]))
        return out


def r(i: int) -> rec.Record:
    return rec.Record(rec.RecordKind.UPDATES, relation_id=1, t_lo=i, t_hi=i, body=f"rec-{i}".encode())
