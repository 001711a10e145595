"""A SIGKILL, a reopen, then a power cut: what the killed process left in the page cache and
the reopen took as it found it must be durable once the reopen has acknowledged appends.

The log rolls over to a new segment: its file is written and fsynced, and the process is
killed before the partition directory is fsynced (the new name is in the page cache only).
The next open reads the new segment, records it as the active one in the manifest and
acknowledges appends into it. A power cut then drops every directory entry never fsynced
(POSIX: an entry is durable only once its parent directory is synced), which takes the new
segment's name and with it those acknowledged appends, unless the open made it durable.
The local log (wal/file_log.py) and a storage node's replica (wal/replication/node/
partition_store.py) open the same way.

Both processes run under the power-loss campaign's recorder (tests/support/faults_power.py):
every file-system call is logged, and the crash state is built from the two logs under the
same rules as the campaign's."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

SEGMENT = 8192
BODY = b"r" * 900


def _record(i: int) -> object:
    from sediment.wal import record as rec

    return rec.Record(rec.RecordKind.UPDATES, relation_id=1, t_lo=i, t_hi=i, count=1, body=BODY + b"%06d" % i)


class _Local:
    """The engine's own log."""

    def __init__(self, base: str, create: bool = False) -> None:
        from sediment.wal.file_log import FileLog

        self.log = FileLog.open(os.path.join(base, "log"), create=create, segment_bytes=SEGMENT,
                                direct_threshold=None)

    def append(self, i: int) -> None:
        self.log.append([_record(i)])

    def bodies(self) -> set[bytes]:
        return {bytes(r.body) for r in self.log.scan()}

    def close(self) -> None:
        self.log.close()


class _Replica:
    """A storage node's store of partition 0; LSNs are the caller's, as a coordinator's are."""

    def __init__(self, base: str, create: bool = False) -> None:
        from support.replication import KEY

        from sediment.wal.replication.node.partition_store import open_directory

        self.store = open_directory(os.path.join(base, "log"), KEY, SEGMENT)(0)

    def append(self, i: int) -> None:
        from sediment.wal import record as rec

        lsn = self.store.next_lsn
        frame = rec.encode(_record(i), lsn)
        self.store.write(frame, lsn, [len(frame)])

    def bodies(self) -> set[bytes]:
        from sediment.wal import record as rec

        out, lsn = set(), self.store.start_lsn
        while lsn < self.store.next_lsn:
            data = self.store.read(lsn, 1 << 20)
            pos = 0
            while pos < len(data):
                head = rec.decode_header(memoryview(data), pos)
                out.add(bytes(data[pos + rec.HEADER_SIZE:pos + head.frame_size]))
                pos += head.frame_size
                lsn += 1
        return out

    def close(self) -> None:
        self.store.close()


KINDS = {"local": (_Local, "sediment.wal.file_log"), "replica": (_Replica, "sediment.wal.replication.node.partition_store")}


def _dump(rec: object, out: str) -> None:
    with rec.lock, open(out, "wb") as f:  # type: ignore[attr-defined]
        pickle.dump({"log": list(rec.log), "ids": dict(rec.ids), "seen": list(rec.ids_seen)}, f)  # type: ignore[attr-defined]


def _acked(acks: str, i: int) -> None:
    with open(acks, "a") as f:
        f.write(f"{i}\n")


def child(kind: str, phase: str, base: str, out: str, acks: str) -> None:
    import importlib

    from support.faults_power import Recorder

    rec = Recorder(base)
    if phase == "second":
        with open(out.replace("second", "first"), "rb") as f:
            first = pickle.load(f)
        rec.ids, rec.ids_seen = first["ids"], first["seen"]
    rec.install()
    from sediment.wal import log_apply

    opener, module = KINDS[kind]
    if phase == "first":
        owner = importlib.import_module(module)
        real_sync, real_create, made = log_apply.fsync_dir, owner.create_segment_files, []

        def create(seg_path: str, *args: object) -> None:
            made.append(seg_path)
            real_create(seg_path, *args)

        def sync(path: str) -> None:
            if len(made) == 2:  # the roll's next segment is written and fsynced, its name is not
                _dump(rec, out)
                os.kill(os.getpid(), signal.SIGKILL)
            real_sync(path)

        owner.create_segment_files, log_apply.fsync_dir = create, sync
        log = opener(base, create=True)
        for i in range(100):
            log.append(i)
            _acked(acks, i)
        raise SystemExit("no rollover happened")
    log = opener(base)
    for i in range(1000, 1003):
        log.append(i)
        _acked(acks, i)
    _dump(rec, out)
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_segment_a_killed_roll_left_unsynced_is_durable_once_the_next_open_appends_to_it(tmp_path, kind):
    from support.faults_power import FsModel, materialize

    base, acks = str(tmp_path / "base"), str(tmp_path / "acks")
    os.makedirs(base)
    events = []
    for phase in ("first", "second"):
        out = str(tmp_path / f"{phase}.pickle")
        got = subprocess.run([sys.executable, os.path.abspath(__file__), kind, phase, base, out, acks],
                             capture_output=True, text=True, timeout=120)
        assert got.returncode == -signal.SIGKILL, got.stderr[-2000:]
        with open(out, "rb") as f:
            events += pickle.load(f)["log"]
    with open(acks) as f:
        acked = [int(line) for line in f]
    assert 1002 in acked and 0 in acked
    model = FsModel(os.path.abspath(base))
    for e in events:
        if e[0] in ("create", "mkdir", "rename", "link", "unlink", "rmdir", "write", "trunc", "extend", "fsync",
                    "dsync"):
            model.step(e)
    dirs, data = model.crash_state(None, "drop")  # every write and entry never synced is gone
    target = str(tmp_path / "after")
    materialize(model.base, dirs, data, target)
    log = KINDS[kind][0](target)
    try:
        kept = log.bodies()
    finally:
        log.close()
    lost = [i for i in acked if bytes(_record(i).body) not in kept]
    assert not lost, f"acknowledged appends lost after the power cut: {lost}"


if __name__ == "__main__":
    child(*sys.argv[1:6])
