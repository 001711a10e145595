"""Kill campaign: a child process runs the seeded workload and reports every call on a pipe
(``b`` before it starts, ``c`` before a transaction's commit, ``a`` when it returned); the
parent SIGKILLs it at a random point, then checks the data directory with ``sediment verify``
and by opening it: every acknowledged update there, no transaction in part, frontiers not
behind what was acknowledged, and verify agreeing with open. The chain then continues on
the same directory from what survived, so later kills land on recovered state (and on open).
"""

from __future__ import annotations

import json
import os
import random
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if TESTS not in sys.path:  # also run as a child process by its path: find the support package
    sys.path.insert(0, TESTS)

from support import faults_model as fm  # noqa: E402
from support.faults_model import DROP_WEIGHT, SEGMENT_SIZES, Model, check_engine, next_op, run_op  # noqa: E402

OPS_PER_CHILD = 24
# The workload's alter weight as the parent has it (a test raises it), handed to each child.
ALTER_WEIGHT_ENV = "FAULTS_ALTER_WEIGHT"
# Steps inside the engine where a child kills itself (SIGKILL) at a chosen call, "before" or
# "after" the real call runs: the narrow windows a kill at a random moment seldom hits.
STEPS = (
    ("sediment.wal.log_apply:pwrite_all", "before"),  # a new segment created and sized, a header not yet written
    ("sediment.wal.manifest:record_rollover", "before"),  # the next segment durable, the roll not recorded
    ("sediment.wal.manifest:record_start", "after"),  # a trim recorded, its files not yet deleted or pooled
    ("sediment.wal.recycle:pwrite_all", "after"),  # a pool file's new header written, not yet renamed
    ("sediment.wal.recycle:fsync_dir", "before"),  # a pool offer or take renamed, the directory not synced
    ("sediment.trace.store:TraceStore.commit", "before"),  # a trace commit (batches written, state not)
    ("sediment.engine.catalog:Catalog.update", "before"),  # an alter (or since) checked, its entry not written
    ("sediment.engine.catalog:Catalog.update", "after"),  # an alter's entry written, the engine not yet told
)
STEP_SHARE = 0.3  # of the kill points: the rest land at a random moment


def wal_options(wal: str, base: str, rng: random.Random | None = None) -> dict:
    """Engine options of one open: small segments so rollover and compaction happen often; on
    the file log a size drawn from SEGMENT_SIZES with ``rng``, so opens change it."""
    if wal == "device":
        return {"wal": f"device:{os.path.join(base, 'ring')}", "wal_capacity": 2 << 20, "segment_bytes": 64 << 10}
    return {"segment_bytes": rng.choice(SEGMENT_SIZES) if rng is not None else 16 << 10}


def check_options(wal: str, opts: dict, rng: random.Random) -> dict:
    """The options of the open that checks a kill's survivors: on the file log, half of the
    time the defaults (64 MiB segments), as an operator's first open after a crash would."""
    return {} if wal == "file" and rng.random() < 0.5 else opts


# --- the child ---------------------------------------------------------------------------------


def arm_step(spec: str, say) -> None:
    """Make this process SIGKILL itself at the n-th call of one engine step (``spec``:
    ``module:qualname|before/after|n``), saying ``k <step>`` first. The real step runs
    unchanged; only the moment of the kill is chosen."""
    import functools
    import importlib

    where, when, nth = spec.split("|")
    module, qual = where.split(":")
    owner = importlib.import_module(module)
    *path, name = qual.split(".")
    for part in path:
        owner = getattr(owner, part)
    real, calls = getattr(owner, name), [0]

    def die() -> None:
        say(f"k {qual}")
        os.kill(os.getpid(), signal.SIGKILL)

    @functools.wraps(real)
    def step(*args, **kwargs):
        calls[0] += 1
        if calls[0] == int(nth) and when == "before":
            die()
        out = real(*args, **kwargs)
        if calls[0] == int(nth):
            die()
        return out

    setattr(owner, name, step)


def child_main(argv: list[str]) -> int:
    data_dir, opts_json, model_path, seed, nops = argv[0], argv[1], argv[2], int(argv[3]), int(argv[4])
    import sediment
    from sediment.errors import SedimentError

    opts = json.loads(opts_json)
    fm.ALTER_WEIGHT = float(os.environ.get(ALTER_WEIGHT_ENV, fm.ALTER_WEIGHT))
    with open(model_path) as f:
        model = Model.from_json(json.load(f))
    rng = random.Random(seed)

    def say(line: str) -> None:
        os.write(1, (line + "\n").encode())

    if len(argv) > 5:
        arm_step(argv[5], say)
    say("o")
    engine = sediment.open(data_dir, **opts)
    say("O")
    for i in range(nops):
        op = next_op(rng, model, drop_weight=DROP_WEIGHT)
        say(f"b {i} {json.dumps(op)}")
        try:
            if op[0] == "reopen":
                engine.close()
                if "wal" not in opts:  # the file log: another segment size
                    opts = {**opts, "segment_bytes": rng.choice(SEGMENT_SIZES)}
                engine = sediment.open(data_dir, **opts)
            else:
                run_op(engine, op, on_commit=lambda i=i: say(f"c {i}"), on_sub_ack=lambda j, i=i: say(f"s {i} {j}"))
        except SedimentError as exc:
            say(f"e {i} {type(exc).__name__}")
            continue
        say(f"a {i}")
        model.apply(op)
    engine.close()
    say("done")
    return 0


# --- the parent --------------------------------------------------------------------------------


@dataclass
class KillStats:
    trials: int = 0
    lost: int = 0
    partial: int = 0
    wrong: int = 0
    refused: int = 0  # typed error at open after a kill
    untyped: int = 0
    hangs: int = 0
    disagree: int = 0
    clean: int = 0  # children that ran to a clean close (their step never came): checked, not kill points
    phases: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


class _Lines:
    """Lines of the child's pipe, kept across calls (one read may hold several lines)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.buf, self.lines = proc, b"", []

    def read(self, until, deadline: float) -> bool:
        """Read until ``until(line)`` holds for a new line (False), EOF (True), or the deadline."""
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while True:
                while b"\n" in self.buf:
                    line, self.buf = self.buf.split(b"\n", 1)
                    self.lines.append(line.decode())
                    if until is not None and until(self.lines[-1]):
                        return False
                if time.monotonic() >= deadline:
                    return False
                if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                    continue
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                if not chunk:
                    return True
                self.buf += chunk


def _parse(lines: list[str]) -> tuple[list[list], list | None, str]:
    """Acknowledged ops in order, the op in flight (None if none, or a transaction whose
    commit never started), and the phase the kill landed in."""
    acked, begun, committing, sub_acked = [], {}, set(), {}
    done: set[int] = set()
    phase = "open"
    for line in lines:
        tag, _, rest = line.partition(" ")
        if tag == "O":
            phase = "idle"
        elif tag == "b":
            i, _, op = rest.partition(" ")
            begun[int(i)] = json.loads(op)
            phase = begun[int(i)][0]
        elif tag == "c":
            committing.add(int(rest))
            phase = "commit"
        elif tag == "k":
            phase = f"step {rest}"
        elif tag == "done":
            phase = "clean close"  # a step kill whose step never came
        elif tag == "s":
            i, j = map(int, rest.split(" "))
            sub_acked.setdefault(i, set()).add(j)
        elif tag in ("a", "e"):
            i = int(rest.split(" ")[0])
            done.add(i)
            if tag == "a":
                acked.append(begun[i])
            phase = "idle"
    inflight = None
    open_ops = [i for i in begun if i not in done]
    if open_ops:
        op = begun[open_ops[-1]]
        if op[0] == "txn" and open_ops[-1] not in committing:
            op = ["txn", op[1], False]  # its commit never started: it must stay invisible
        if op[0] == "reopen":
            phase = "reopen"
        if op[0] == "burst":  # the appends that returned are acknowledged; the rest are in flight
            done_subs = sub_acked.get(open_ops[-1], set())
            acked += [s for j, s in enumerate(op[1]) if j in done_subs]
            op = ["burst", [s for j, s in enumerate(op[1]) if j not in done_subs]]
        inflight = op
    return acked, inflight, phase


def kill_trial(data_dir: str, opts: dict, model: Model, rng: random.Random, child_seed: int,
               stats: KillStats, timeout: float = 60.0, check_opts: dict | None = None,
               step_share: float = STEP_SHARE) -> tuple[Model | None, str]:
    """One kill: returns the model after it (None when the chain must restart) and a note.
    ``check_opts``: the options of the checking open (default: ``opts``); ``step_share``: the
    chance that the child kills itself inside one of STEPS."""
    import sediment
    from sediment.engine.verify import verify_data_dir
    from sediment.errors import SedimentError

    model_path = os.path.join(os.path.dirname(data_dir), "model.json")
    with open(model_path, "w") as f:
        json.dump(model.to_json(), f)
    target = rng.randrange(-1, OPS_PER_CHILD)
    delay = rng.choice((0.0, rng.uniform(0, 0.003), rng.uniform(0, 0.03), rng.uniform(0, 0.15)))
    want = "o" if target < 0 else f"b {target} "
    step = []
    if rng.random() < step_share:  # the child kills itself inside a step; a run that never reaches it ends cleanly
        where, when = rng.choice([s for s in STEPS if not s[0].startswith("sediment.wal.")] if "wal" in opts
                                 else STEPS)  # the device ring has no segment files
        step, want, delay = [f"{where}|{when}|{rng.randrange(1, 4)}"], "k ", 0.0
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "child", data_dir, json.dumps(opts),
                             model_path, str(child_seed), str(OPS_PER_CHILD), *step],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env={**os.environ, ALTER_WEIGHT_ENV: repr(fm.ALTER_WEIGHT)})
    deadline = time.monotonic() + timeout
    reader = _Lines(proc)
    eof = reader.read(lambda ln: ln == want or ln.startswith(want), deadline)
    if not eof:
        if delay:
            time.sleep(delay)  # the kill point: a random moment inside (or after) the call
        os.kill(proc.pid, signal.SIGKILL)
    reader.read(None, time.monotonic() + 10)
    lines = reader.lines
    proc.wait()
    stats.trials += 1
    if time.monotonic() > deadline:
        stats.hangs += 1
        return None, "child hang"
    acked, inflight, phase = _parse(lines)
    stats.phases[phase] = stats.phases.get(phase, 0) + 1
    stats.clean += phase == "clean close"
    for op in acked:
        model.apply(op)
    existed = os.path.isdir(data_dir)  # a kill inside the first open can come before the directory exists
    report = verify_data_dir(data_dir)
    try:
        with sediment.open(data_dir, **(opts if check_opts is None else check_opts)) as engine:
            check = check_engine(engine, model, inflight)
    except SedimentError as exc:
        stats.refused += 1
        stats.disagree += report.ok
        return None, f"open refused after a kill in phase {phase}: {type(exc).__name__}: {str(exc)[:200]}"
    except Exception as exc:  # noqa: BLE001 - the campaign counts it
        stats.untyped += 1
        stats.disagree += report.ok
        return None, f"untyped {type(exc).__name__} at open after a kill in phase {phase}: {str(exc)[:200]}"
    if existed and report.ok != check.ok:  # no directory: verify rightly says so; the check judges the open
        stats.disagree += 1
        stats.failures.append(f"verify {'ok' if report.ok else 'problems'} but open "
                              f"{'good' if check.ok else check.kind} (phase {phase}): {report.problems[:2]}")
    if not check.ok:
        setattr(stats, check.kind, getattr(stats, check.kind) + 1)
        return None, f"{check.kind} after a kill in phase {phase}: {check.detail[:300]}"
    after = verify_data_dir(data_dir)  # what the checking open left: the next open must not refuse either
    if not after.ok:
        stats.refused += 1
        return None, f"open refused after a kill in phase {phase}, at the open after the check: {after.problems[:2]}"
    return check.model, ""


def run_kills(base: str, wal: str, trials: int, seed: int, stats: KillStats, log=print,
              step_share: float = STEP_SHARE) -> KillStats:
    """``trials`` kills on chains of one data directory each (a new chain after a failure).
    A child that never reached its step ran to a clean close: checked all the same, but not
    counted as a kill point (``stats.clean``)."""
    import shutil

    rng = random.Random(seed)
    chain = 0
    model: Model | None = None
    data_dir = ""
    n = -1
    target = stats.trials - stats.clean + trials
    while stats.trials - stats.clean < target and n < 3 * trials:  # bounded even if steps never come
        n += 1
        if model is None:
            chain += 1
            root = os.path.join(base, f"{wal}-{chain}")
            shutil.rmtree(root, ignore_errors=True)
            os.makedirs(root)
            data_dir = os.path.join(root, "data")
            model = Model()
        opts = wal_options(wal, os.path.dirname(data_dir), rng)
        child_seed = seed * 1_000_003 + n
        model, note = kill_trial(data_dir, opts, model, rng, child_seed, stats,
                                 check_opts=check_options(wal, opts, rng), step_share=step_share)
        if note:
            stats.failures.append(f"[{wal} trial {n}] {note}")
            log(f"  kills/{wal} trial {n}: {note}")
    return stats


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "child":
    sys.exit(child_main(sys.argv[2:]))
