"""Power-loss campaign, after ALICE (OSDI 2014): record every file-system call of a workload,
then build the states a power cut can leave under POSIX rules and open each.

The child process interposes on ``os.open/write/pwrite/pwritev/ftruncate/posix_fallocate/
fsync/fdatasync/rename/replace/link/unlink/remove/mkdir/rmdir/close`` (one lock around each
call and its record, so the log is the order the kernel saw) and logs each call with its data,
plus ``begin``/``commit``/``ack`` of every workload call (and ``sack`` of each append of a
burst: appends from 2-4 concurrent threads, which the file log's leader may write as one
joined record, so crash states also cut through joined records and their fdatasync). At each fsync it also records the
file's whole content, which covers bytes written by native code (pyarrow's Parquet writer
bypasses ``os``): those bytes become durable at the sync, and before it they count as lost.

Rules: a file's bytes are durable after an fsync/fdatasync of that file; a directory entry
(create, rename, link, unlink, mkdir, rmdir) after an fsync of its parent directory. A crash
state is the durable state plus a choice of the pending operations: all dropped, all kept,
each kept at random, or kept with the last pending write of one file torn. Each state is
opened and compared with what was acknowledged before the crash point (a call in flight may
be there entirely or not at all); ``sediment verify`` runs on it too.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import stat
import subprocess
import sys
import threading
from dataclasses import dataclass, field

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if TESTS not in sys.path:  # also run as a child process by its path: find the support package
    sys.path.insert(0, TESTS)

from support.faults_model import DROP_WEIGHT, Model, check_engine, next_op, run_op  # noqa: E402
from support.faults_model import SEGMENT_SIZES as SIZES  # noqa: E402 - each workload opens with one, reopens with others

BURST_WEIGHT = 0.2  # concurrent appends; runs of them to one relation become joined records


def options_of(seed: int) -> dict:
    """The options a workload first opens with (and its crash states are checked with)."""
    return {"segment_bytes": SIZES[seed % len(SIZES)]}
STRATEGIES = ("drop", "keep", "random", "torn")


# --- recording (in the child) ------------------------------------------------------------------


class Recorder:
    def __init__(self, base: str) -> None:
        self.base = os.path.abspath(base)
        self.log: list[tuple] = []
        self.lock = threading.RLock()
        self.fds: dict[int, tuple[str, int, bool]] = {}  # fd -> (path, ino, is_dir)
        self.dsync_fds: set[int] = set()
        self.ids: dict[int, int] = {}
        self.ids_seen: list[int] = []
        self.joining = threading.local()  # a leader's joined records, marked on its next segment write
        self.real = {n: getattr(os, n) for n in (
            "open", "write", "pwrite", "pwritev", "ftruncate", "posix_fallocate", "fsync", "fdatasync",
            "rename", "replace", "link", "unlink", "remove", "mkdir", "rmdir", "close")}

    def mine(self, path) -> str | None:
        p = os.path.abspath(os.fspath(path))
        return p if p == self.base or p.startswith(self.base + os.sep) else None

    def ino(self, path: str, fresh: bool = False) -> int:
        """A file's identity in the log: the kernel reuses inode numbers of deleted files, so
        a file created anew gets a new id."""
        real = os.stat(path).st_ino
        if fresh or real not in self.ids:
            self.ids[real] = len(self.ids_seen)
            self.ids_seen.append(real)
        return self.ids[real]

    def install(self) -> None:
        r, real = self, self.real

        def _open(path, flags, mode=0o777, *, dir_fd=None):
            with r.lock:
                p = r.mine(path)
                existed = p is not None and os.path.lexists(p)
                fd = real["open"](path, flags, mode, dir_fd=dir_fd)
                if p is not None:
                    is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
                    ino = r.ino(p, fresh=not existed)
                    r.fds[fd] = (p, ino, is_dir)
                    if flags & (os.O_SYNC | os.O_DSYNC):
                        r.dsync_fds.add(fd)
                    if not existed and flags & os.O_CREAT:
                        r.log.append(("create", os.path.dirname(p), os.path.basename(p), ino))
                    elif flags & os.O_TRUNC and not is_dir:
                        r.log.append(("trunc", ino, 0))
                return fd

        def _close(fd):
            with r.lock:
                r.fds.pop(fd, None)
                r.dsync_fds.discard(fd)
                return real["close"](fd)

        def _written(fd, offset, data):
            info = r.fds.get(fd)
            if info is not None and data:
                joined = getattr(r.joining, "records", 0)
                if joined and info[0].endswith(".seg"):
                    r.joining.records = 0
                    r.log.append(("joined", info[1], offset, joined))
                r.log.append(("write", info[1], offset, bytes(data)))
                if fd in r.dsync_fds:
                    r._sync(fd)

        def _write(fd, data):
            with r.lock:
                off = 0
                if fd in r.fds:
                    off = os.fstat(fd).st_size if _is_append(fd) else os.lseek(fd, 0, os.SEEK_CUR)
                n = real["write"](fd, data)
                _written(fd, off, memoryview(data)[:n])
                return n

        def _pwrite(fd, data, offset):
            with r.lock:
                n = real["pwrite"](fd, data, offset)
                _written(fd, offset, memoryview(data)[:n])
                return n

        def _pwritev(fd, buffers, offset, *flags):
            with r.lock:
                buffers = list(buffers)
                n = real["pwritev"](fd, buffers, offset, *flags)
                _written(fd, offset, b"".join(bytes(b) for b in buffers)[:n])
                return n

        def _ftruncate(fd, length):
            with r.lock:
                real["ftruncate"](fd, length)
                if fd in r.fds:
                    r.log.append(("trunc", r.fds[fd][1], length))

        def _fallocate(fd, offset, length):
            with r.lock:
                real["posix_fallocate"](fd, offset, length)
                if fd in r.fds:
                    r.log.append(("extend", r.fds[fd][1], offset + length))

        def _fsync_like(name):
            def call(fd):
                with r.lock:
                    real[name](fd)
                    if fd in r.fds:
                        r._sync(fd)
            return call

        def _two(name, kind):
            def call(src, dst, *a, **k):
                with r.lock:
                    real[name](src, dst, *a, **k)
                    s, d = r.mine(src), r.mine(dst)
                    if d is not None:
                        r.log.append((kind, os.path.dirname(s or d), os.path.basename(s or d), os.path.dirname(d),
                                      os.path.basename(d), r.ino(d), os.path.isdir(d)))
            return call

        def _one(name, kind):
            def call(path, *a, **k):
                with r.lock:
                    real[name](path, *a, **k)
                    p = r.mine(path)
                    if p is not None:
                        r.log.append((kind, os.path.dirname(p), os.path.basename(p)))
            return call

        def _is_append(fd):
            import fcntl
            return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND)

        os.open, os.close, os.write, os.pwrite, os.pwritev = _open, _close, _write, _pwrite, _pwritev
        os.ftruncate, os.posix_fallocate = _ftruncate, _fallocate
        os.fsync, os.fdatasync = _fsync_like("fsync"), _fsync_like("fdatasync")
        os.rename, os.replace, os.link = _two("rename", "rename"), _two("replace", "rename"), _two("link", "link")
        os.unlink, os.remove = _one("unlink", "unlink"), _one("remove", "unlink")
        os.mkdir, os.rmdir = _one("mkdir", "mkdir"), _one("rmdir", "rmdir")

    def _sync(self, fd: int) -> None:
        path, ino, is_dir = self.fds[fd]
        if is_dir:
            self.log.append(("dsync", path))
        else:
            with open(f"/proc/self/fd/{fd}", "rb") as f:  # the fd may be write-only
                self.log.append(("fsync", ino, f.read()))

    def mark(self, *event) -> None:
        with self.lock:
            self.log.append(event)


def record_main(argv: list[str]) -> int:
    base, seed, nops, out = argv[0], int(argv[1]), int(argv[2]), argv[3]
    os.makedirs(base, exist_ok=True)
    rec = Recorder(base)
    rec.install()
    import sediment
    from sediment.wal import file_log

    def observed_join(batch, _join=file_log.join_group):
        """The leader's join, observed: the records it joined are marked on its next write."""
        out, joined = _join(batch)
        if joined:
            rec.joining.records = len(joined)
        return out, joined

    file_log.join_group = observed_join
    data = os.path.join(base, "data")
    rng = random.Random(seed)
    model = Model()
    engine = sediment.open(data, **options_of(seed))
    for i in range(nops):
        op = next_op(rng, model, compact_weight=0.12, reopen_weight=0.06, burst_weight=BURST_WEIGHT,
                     drop_weight=DROP_WEIGHT, burst_one_relation=0.8)
        rec.mark("begin", i, op)
        if op[0] == "reopen":
            engine.close()
            engine = sediment.open(data, segment_bytes=rng.choice(SIZES))
        else:
            run_op(engine, op, on_commit=lambda i=i: rec.mark("commit", i),
                   on_sub_ack=lambda j, i=i: rec.mark("sack", i, j))
        rec.mark("ack", i)
        model.apply(op)
    engine.close()
    with open(out, "wb") as f:
        pickle.dump({"base": rec.base, "log": rec.log}, f)
    return 0


# --- crash states (in the parent) --------------------------------------------------------------


@dataclass
class FsModel:
    """The durable and the volatile file system, replayed from the log."""

    base: str
    durable_dirs: dict[str, dict[str, tuple]] = field(default_factory=dict)  # dir -> name -> ("f", ino) | ("d",)
    volatile_dirs: dict[str, dict[str, tuple]] = field(default_factory=dict)
    pending_dir: dict[str, list[tuple]] = field(default_factory=dict)
    durable_data: dict[int, bytes] = field(default_factory=dict)
    pending_data: dict[int, list[tuple]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.durable_dirs[self.base] = {}
        self.volatile_dirs[self.base] = {}

    def _dir_op(self, parent: str, op: tuple) -> None:
        self.volatile_dirs.setdefault(parent, {})
        self.pending_dir.setdefault(parent, []).append(op)
        _apply_dir(self.volatile_dirs, op)

    def step(self, e: tuple) -> None:
        kind = e[0]
        if kind == "create":
            _, parent, name, ino = e
            self.durable_data.setdefault(ino, b"")
            self._dir_op(parent, ("set", parent, name, ("f", ino)))
        elif kind == "mkdir":
            _, parent, name = e
            self.volatile_dirs.setdefault(os.path.join(parent, name), {})
            self.durable_dirs.setdefault(os.path.join(parent, name), {})
            self._dir_op(parent, ("set", parent, name, ("d",)))
        elif kind in ("rename", "link"):
            _, sp, sn, dp, dn, ino, is_dir = e
            entry = ("d",) if is_dir else ("f", ino)
            self.durable_data.setdefault(ino, b"")
            if kind == "rename" and sp == dp:
                self._dir_op(dp, ("move", dp, sn, dn, entry))
            else:
                self._dir_op(dp, ("set", dp, dn, entry))
                if kind == "rename":
                    self._dir_op(sp, ("del", sp, sn))
        elif kind in ("unlink", "rmdir"):
            self._dir_op(e[1], ("del", e[1], e[2]))
        elif kind in ("write", "trunc", "extend"):
            self.durable_data.setdefault(e[1], b"")
            self.pending_data.setdefault(e[1], []).append(e)
        elif kind == "fsync":
            self.durable_data[e[1]] = e[2]
            self.pending_data[e[1]] = []
        elif kind == "dsync":
            self.durable_dirs[e[1]] = dict(self.volatile_dirs.get(e[1], {}))
            self.pending_dir[e[1]] = []

    def crash_state(self, rng: random.Random, strategy: str) -> tuple[dict, dict]:
        """(dirs, data) of one state a power cut may leave now."""
        dirs = {d: dict(v) for d, v in self.durable_dirs.items()}
        for parent, ops in self.pending_dir.items():
            dirs.setdefault(parent, {})
            for op in ops:
                if strategy == "keep" or strategy == "torn" or strategy == "random" and rng.random() < 0.5:
                    _apply_dir(dirs, op)
        data = {}
        torn_ino = None
        if strategy == "torn":
            candidates = [i for i, w in self.pending_data.items() if any(x[0] == "write" for x in w)]
            torn_ino = rng.choice(candidates) if candidates else None
        for ino, base in self.durable_data.items():
            buf = bytearray(base)
            ops = self.pending_data.get(ino, [])
            if ino == torn_ino:
                cut = rng.randrange(len(ops))
                ops = ops[:cut + 1]
            for n, op in enumerate(ops):
                if strategy == "drop" or strategy == "random" and rng.random() < 0.5:
                    continue
                if ino == torn_ino and n == len(ops) - 1 and op[0] == "write":
                    op = ("write", op[1], op[2], op[3][:rng.randrange(len(op[3]) + 1)])
                _apply_data(buf, op)
            data[ino] = bytes(buf)
        return dirs, data


def _apply_dir(dirs: dict, op: tuple) -> None:
    if op[0] == "set":
        dirs.setdefault(op[1], {})[op[2]] = op[3]
    elif op[0] == "del":
        dirs.setdefault(op[1], {}).pop(op[2], None)
    elif op[0] == "move":
        d = dirs.setdefault(op[1], {})
        d.pop(op[2], None)
        d[op[3]] = op[4]


def _apply_data(buf: bytearray, op: tuple) -> None:
    if op[0] == "write":
        off, payload = op[2], op[3]
        if off > len(buf):
            buf.extend(bytes(off - len(buf)))
        buf[off:off + len(payload)] = payload
    elif op[0] == "trunc":
        del buf[op[2]:]
        if op[2] > len(buf):
            buf.extend(bytes(op[2] - len(buf)))
    elif op[0] == "extend" and op[2] > len(buf):
        buf.extend(bytes(op[2] - len(buf)))


def materialize(base: str, dirs: dict, data: dict, target: str) -> None:
    shutil.rmtree(target, ignore_errors=True)
    os.makedirs(target)

    def walk(src: str, dst: str) -> None:
        for name, entry in dirs.get(src, {}).items():
            if entry[0] == "d":
                os.mkdir(os.path.join(dst, name))
                walk(os.path.join(src, name), os.path.join(dst, name))
            else:
                with open(os.path.join(dst, name), "wb") as f:
                    f.write(data.get(entry[1], b""))

    walk(base, target)


@dataclass
class PowerStats:
    traces: int = 0
    states: int = 0
    lost: int = 0
    partial: int = 0
    wrong: int = 0
    refused: int = 0
    untyped: int = 0
    disagree: int = 0
    bursts: int = 0  # concurrent bursts in the recorded workloads
    joined_records: int = 0  # records joining several appends, marked by the leader on its write
    states_in_joined: int = 0  # crash states with a joined record written but not yet synced
    pool_offers: int = 0  # trimmed segment files kept for reuse, in the recorded workloads
    pool_takes: int = 0  # pool files made new segments
    states_after_reuse: int = 0  # crash states cut after a pool file became a segment
    by_strategy: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


def check_state(target: str, acked: Model, inflight: list | None, opts: dict) -> tuple[str, str, bool]:
    """Open one crash state with ``opts``: (result, detail, verify ok). result: ok/lost/
    partial/wrong/refused/untyped."""
    import sediment
    from sediment.engine.verify import verify_data_dir
    from sediment.errors import SedimentError

    data = os.path.join(target, "data")
    try:
        report = verify_data_dir(data)
        vok, vnote = report.ok, "; ".join(report.problems)[:200]
    except Exception as exc:  # noqa: BLE001 - verify crashing counts as disagreeing
        vok, vnote = False, f"verify crashed: {type(exc).__name__}: {exc}"
    if not os.path.isdir(data) and not acked.updates:
        return "ok", "", True  # nothing was created yet: verify's "no such directory" is right too
    try:
        with sediment.open(data, **opts) as engine:
            c = check_engine(engine, acked, inflight)
    except SedimentError as exc:
        return "refused", f"{type(exc).__name__}: {str(exc)[:200]}", vok
    except Exception as exc:  # noqa: BLE001 - classified
        return "untyped", f"{type(exc).__name__}: {str(exc)[:200]}", vok
    return ("ok", vnote, vok) if c.ok else (c.kind, c.detail[:200], vok)


def _pool_event(e: tuple) -> str:
    """A recorded rename into the segment pool ("offer") or out of it ("take"), else ""."""
    from sediment.wal.segment import RECYCLED_SUFFIX

    if e[0] != "rename":
        return ""
    return "offer" if e[4].endswith(".seg" + RECYCLED_SUFFIX) else "take" if e[2].endswith(".seg" + RECYCLED_SUFFIX) else ""


def _joined_points(events: list[tuple]) -> list[tuple[int, str | None]]:
    """(crash point, strategy) aimed at joined records: just after each one's write, with the
    strategies in turn (its appends are in flight: each there entirely or not at all), and
    just after each append of its burst that returned after it, with every unsynced write
    dropped (an acknowledged append must be durable already)."""
    points: list[tuple[int, str | None]] = []
    for k, e in enumerate(events):
        if e[0] == "joined":  # the next event is the leader's write holding the joined records
            points.append((k + 2, None))
            for n in range(k + 2, len(events)):
                if events[n][0] == "ack":
                    break
                if events[n][0] == "sack":
                    points.append((n + 1, "drop"))
    return points


def run_power(work: str, seed: int, states: int, stats: PowerStats, nops: int = 40, log=print,
              first: int | None = None) -> PowerStats:
    """Record one workload (seeded), then check ``states`` crash states spread over it (over
    its first ``first`` recorded events only, when given)."""
    rec_base = os.path.join(work, f"rec-{seed}")
    shutil.rmtree(rec_base, ignore_errors=True)
    trace_path = os.path.join(work, f"trace-{seed}.pickle")
    subprocess.run([sys.executable, os.path.abspath(__file__), "record", rec_base, str(seed), str(nops), trace_path],
                   check=True, stderr=subprocess.DEVNULL, timeout=600)
    with open(trace_path, "rb") as f:
        trace = pickle.load(f)
    events = trace["log"]
    stats.traces += 1
    rng = random.Random(seed)
    span = len(events) + 1 if first is None else min(first, len(events) + 1)
    windows = [p for p in _joined_points(events) if p[0] < span]
    aimed = states // 4 if windows else 0
    points = sorted([(rng.randrange(span), None) for _ in range(states - aimed)] +
                    [windows[i % len(windows)] for i in range(aimed)], key=lambda p: p[0])
    fs = FsModel(trace["base"])
    model, begun, committing, done = Model(), {}, set(), set()
    reused = False
    pool = [_pool_event(e) for e in events]
    stats.pool_offers += pool.count("offer")
    stats.pool_takes += pool.count("take")
    stats.bursts += sum(e[0] == "begin" and e[2][0] == "burst" for e in events)
    stats.joined_records += sum(e[3] for e in events if e[0] == "joined")
    joined_writes = {(e[1], e[2]) for e in events if e[0] == "joined"}
    sub_acked: dict[int, set[int]] = {}
    pos = 0
    target = os.path.join(work, "state")
    for n, (point, forced) in enumerate(points):
        while pos < point:
            e = events[pos]
            pos += 1
            if e[0] == "begin":
                begun[e[1]] = e[2]
            elif e[0] == "commit":
                committing.add(e[1])
            elif e[0] == "sack":  # one append of a burst returned: acknowledged on its own
                sub_acked.setdefault(e[1], set()).add(e[2])
                model.apply(begun[e[1]][1][e[2]])
            elif e[0] == "ack":
                done.add(e[1])
                op = begun[e[1]]
                if op[0] == "burst":
                    op = ["burst", [s for j, s in enumerate(op[1]) if j not in sub_acked.get(e[1], ())]]
                model.apply(op)
            else:
                reused = reused or pool[pos - 1] == "take"
                fs.step(e)
        inflight = None
        open_ops = [i for i in begun if i not in done]
        if open_ops:
            inflight = begun[open_ops[-1]]
            if inflight[0] == "txn" and open_ops[-1] not in committing:
                inflight = ["txn", inflight[1], False]
            if inflight[0] == "burst":  # its appends not yet returned: each there entirely or not at all
                inflight = ["burst", [s for j, s in enumerate(inflight[1]) if j not in sub_acked.get(open_ops[-1], ())]]
        stats.states_in_joined += any(w[0] == "write" and (w[1], w[2]) in joined_writes
                                      for ops in fs.pending_data.values() for w in ops)
        strategy = forced or STRATEGIES[n % len(STRATEGIES)]
        dirs, data = fs.crash_state(random.Random(f"{seed}:{n}"), strategy)
        materialize(fs.base, dirs, data, target)
        result, detail, vok = check_state(target, model, inflight, {} if n % 2 else options_of(seed))
        stats.states += 1
        stats.states_after_reuse += reused
        if (result == "ok") != vok:
            stats.disagree += 1
            stats.failures.append(f"[power seed {seed} state {n} point {point}/{len(events)} {strategy}] verify "
                                  f"{'ok' if vok else 'problems'} but open {result}: {detail}")
        if result != "ok":
            setattr(stats, result, getattr(stats, result) + 1)
            stats.by_strategy[strategy] = stats.by_strategy.get(strategy, 0) + 1
            op = begun.get(max(begun)) if begun else None
            note = (f"[power seed {seed} state {n} point {point}/{len(events)} {strategy}] {result} "
                    f"(last call {json.dumps(op)[:60]}; verify {'ok' if vok else 'problems'}): {detail}")
            stats.failures.append(note)
            log("  " + note)
    return stats


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "record":
    sys.exit(record_main(sys.argv[2:]))
