"""One client process of the nemesis campaigns (bench/nemesis.py, bench/nemesis_s3.py): keyed
appends, seals and snapshot reads through ``sediment.connect("zk://...")`` (or the S3-only
deployment's failover client), each call timed and its outcome recorded for the checker
(tests/support/nemesis_checker.py).

Appenders (one client id each) send ``append_once`` with their own sequence numbers and
retry an append whose outcome is unknown with the same key, as the README tells users to
("read back or retry idempotently"), up to ``ATTEMPTS`` times; a sealer seals a relation
``LAG_MS`` behind the clock; a reader asks ``sealed()`` and reads a snapshot at or below it.
Every call is bounded by ``hang_bound`` seconds: one past it counts as hung, and one still
running when the process is told to stop and its threads have had ``hang_bound`` seconds
is recorded as hung too. The history goes to a JSON file once every thread ended or hung.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import pyarrow as pa
from support.nemesis_checker import OK, REFUSED, UNKNOWN, Append, Call, History, Read, Sealed

ATTEMPTS = 4  # tries of one keyed append (the first and three resends of its key)
LAG_MS = 2_000  # seals trail the clock by this much, so appends (at the clock) are rarely below them
APPEND_PAUSE = 0.02  # seconds between one appender's appends: keep two shared cores for the cluster
SEAL_PAUSE = 0.25
READ_PAUSE = 0.3
SCHEMA = pa.schema([("k", pa.int64())])


def now_ms() -> int:
    return int(time.time() * 1000)


def row_key(process: int, thread: int, seq: int, i: int) -> int:
    """A row's key, unique over the run: who sent it, in which append, which row."""
    return (((process << 4 | thread) << 36) | seq) << 3 | i


class Recorder:
    """The process's history and the call each thread is in (for the hang count at the end)."""

    def __init__(self, hang_bound: float) -> None:
        self.hang_bound = hang_bound
        self.history = History()
        self.lock = threading.Lock()
        self.running: dict[str, tuple[str, float]] = {}  # thread -> (call, started)
        self.absorbed: Counter = Counter()  # errors of single tries the client's retries went past, by type

    def tried(self, attempt: Callable[[], Any]) -> Any:
        """One try inside the client's retries: its error counted, then passed on."""
        try:
            return attempt()
        except Exception as exc:
            with self.lock:
                self.absorbed[type(exc).__name__] += 1
            raise

    def call(self, who: str, kind: str, fn: Callable[[], Any]) -> tuple[Any, BaseException | None]:
        """``fn()``'s result or exception, the call recorded with its type and duration."""
        from sediment.errors import SedimentError

        start = time.monotonic()
        with self.lock:
            self.running[who] = (kind, start)
        result: Any = None
        error: BaseException | None = None
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001 - every failure is recorded, by type
            error = exc
        took = time.monotonic() - start
        with self.lock:
            self.running.pop(who, None)
            self.history.calls.append(Call(kind, None if error is None else type(error).__name__,
                                           error is None or isinstance(error, SedimentError), took > self.hang_bound,
                                           took, "" if error is None else str(error).split("\n")[0][:300]))
        return result, error

    def still_running(self) -> list[str]:
        """Record the calls under way now as hung; their threads' names."""
        with self.lock:
            hung = dict(self.running)
            now = time.monotonic()
            self.history.calls += [Call(kind, None, True, True, now - start) for kind, start in hung.values()]
            return sorted(hung)


def append_loop(db: Any, rec: Recorder, process: int, thread: int, relations: list[str], rng: random.Random,
                stop: threading.Event, client: str) -> None:
    """Keyed appends of 1-3 rows until ``stop``; each retried with its key while its outcome is unknown."""
    from sediment.errors import NothingWritten

    seq = 0
    while not stop.is_set():
        seq += 1
        name = rng.choice(relations)
        n = rng.randint(1, 3)
        keys = tuple(row_key(process, thread, seq, i) for i in range(n))
        t = now_ms()
        table = pa.table({"k": pa.array(keys, pa.int64()), "time": pa.array([t] * n, pa.int64()),
                          "diff": pa.array([1] * n, pa.int64())})
        start, outcome = time.monotonic(), UNKNOWN
        with rec.lock:  # recorded before it is sent: a thread that hangs leaves it unknown
            at = len(rec.history.appends)
            rec.history.appends.append(Append(client, seq, name, keys, t, start, start, UNKNOWN))
        for _ in range(ATTEMPTS):
            _r, error = rec.call(client, "append", lambda name=name, table=table, seq=seq: db.route(
                name, lambda c: rec.tried(lambda: c.append_once(name, table, client, seq)), retry_unknown=True,
                unknown_outcome=True))
            if error is None:
                outcome = OK
                break
            if isinstance(error, NothingWritten):
                outcome = REFUSED
                break
        with rec.lock:
            rec.history.appends[at] = Append(client, seq, name, keys, t, start, time.monotonic(), outcome)
        time.sleep(rng.uniform(0, 2 * APPEND_PAUSE))


def seal_loop(db: Any, rec: Recorder, who: str, relations: list[str], rng: random.Random,
              stop: threading.Event) -> None:
    """Seal a relation ``LAG_MS`` behind the clock every ``SEAL_PAUSE`` s; an acknowledged
    seal says the frontier is at least its time."""
    while not stop.is_set():
        name, t = rng.choice(relations), now_ms() - LAG_MS
        start = time.monotonic()
        _r, error = rec.call(who, "seal", lambda name=name, t=t: db.seal(name, t))
        if error is None:
            with rec.lock:
                rec.history.sealed.append(Sealed(who, name, t, start, time.monotonic(), at_least=True))
        stop.wait(rng.uniform(0, 2 * SEAL_PAUSE))


def read_loop(db: Any, rec: Recorder, who: str, relations: list[str], rng: random.Random,
              stop: threading.Event) -> None:
    """``sealed()`` then a snapshot at it or up to 3 s below it, every ``READ_PAUSE`` s."""
    while not stop.is_set():
        name = rng.choice(relations)
        start = time.monotonic()
        sealed, error = rec.call(who, "sealed", lambda name=name: db.sealed(name))
        if error is None:
            with rec.lock:
                rec.history.sealed.append(Sealed(who, name, sealed, start, time.monotonic()))
            if sealed >= 0:
                as_of = sealed if rng.random() < 0.5 else max(0, sealed - rng.randint(0, 3_000))
                start = time.monotonic()
                snap, error = rec.call(who, "snapshot", lambda name=name, as_of=as_of: db.snapshot(name, as_of))
                if error is None:
                    keys = [k for k, d in zip(snap.column("k").to_pylist(), snap.column("diff").to_pylist(),
                                              strict=True) if d > 0]
                    with rec.lock:
                        rec.history.reads.append(Read(who, name, as_of, frozenset(keys), start, time.monotonic()))
        stop.wait(rng.uniform(0, 2 * READ_PAUSE))


def run(process: int, uri: str, token: str, relations: list[str], seed: int, appenders: int, hang_bound: float,
        out_path: str, stop_event: Any, connect: Callable[..., Any] | None = None) -> None:
    """The client process: its threads until ``stop_event``, then the history to ``out_path``.
    ``connect(uri, token=...)``: the client (default ``sediment.connect``; an S3-only
    deployment's is bench/nemesis_failover.py's)."""
    import sediment

    os.environ["SEDIMENT_TOKEN"] = token
    rng = random.Random(seed * 1000 + process)
    rec = Recorder(hang_bound)
    who = f"p{process}"
    db = None
    while db is None and not stop_event.is_set():  # a connect that met a fault: a typed error, recorded; again
        db, _error = rec.call(f"{who}-connect", "connect", lambda: (connect or sediment.connect)(uri, token=token))
        if db is None:
            stop_event.wait(0.5)
    stop = threading.Event()
    threads = [threading.Thread(target=append_loop, args=(db, rec, process, j, relations, random.Random(rng.random()),
                                                          stop, f"nemesis-{seed}-{process}-{j}"), daemon=True)
               for j in range(appenders)]
    threads.append(threading.Thread(target=seal_loop, args=(db, rec, f"{who}-seal", relations,
                                                            random.Random(rng.random()), stop), daemon=True))
    threads.append(threading.Thread(target=read_loop, args=(db, rec, f"{who}-read", relations,
                                                            random.Random(rng.random()), stop), daemon=True))
    if db is None:  # told to stop before it could connect: nothing sent
        threads = []
    for t in threads:
        t.start()
    stop_event.wait()
    stop.set()
    deadline = time.monotonic() + hang_bound * ATTEMPTS
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    hung = rec.still_running()
    with rec.lock:
        out = {"hung_threads": hung, "absorbed": dict(rec.absorbed), **asdict(rec.history)}
    for r in out["reads"]:
        r["keys"] = sorted(r["keys"])
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.replace(tmp, out_path)
    if hung:
        os._exit(0)  # threads stuck in a call: do not wait for them at exit
    if db is not None:
        db.close()


def load(paths: list[str]) -> tuple[History, list[str], Counter]:
    """Every client's history, as one, the threads that hung, and the errors of the appends'
    single tries that the client's retries went past."""
    h, hung, absorbed = History(), [], Counter()
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        hung += data["hung_threads"]
        absorbed.update(data["absorbed"])
        h.appends += [Append(**{**a, "keys": tuple(a["keys"])}) for a in data["appends"]]
        h.reads += [Read(**{**r, "keys": frozenset(r["keys"])}) for r in data["reads"]]
        h.sealed += [Sealed(**s) for s in data["sealed"]]
        h.calls += [Call(**c) for c in data["calls"]]
    return h, hung, absorbed
