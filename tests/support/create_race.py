"""Two coordinators creating the same deployment at once, as real processes driven step by step.

Each :class:`Racer` is a ``sediment.open`` in a child process that stops at the steps the
test names and goes on when told, so an interleaving happens the same way every run. The
steps are the real code's own: the child wraps a function to stop after it returned (or,
for the partition probe, before the real one runs); nothing of the open is replaced.

* ``read``, always: after the storage record was read (``created`` says none was there);
* ``probe``: a replicated log about to ask the storage nodes whether they hold a partition
  its metadata has no record of (``ReplicatedLog.open``);
* ``session``: a replicated log's new store session written in the metadata, before the
  storage nodes are asked to join it (its recovery);
* ``claimed``: after the log was opened (claimed), before the catalog is read and the log
  replayed; ``recovered``: after the replay, before the storage record is written;
  ``recorded``: after this open wrote it, before the open starts the engine's work. At each,
  ``go-when-fenced`` waits (a deadline, on the engine's own state) until the open has heard
  that another coordinator took the log over, then goes on;
* after the open: ``opened created|found <engine id>``, then the engine stays open until
  ``wait-superseded`` (prints ``superseded <error>`` once a fence closed it) or ``close``.

``metadata_object`` in the options: the metadata store is given to ``sediment.open`` as an
object made from the spec. Each step stops once, if named in ``holds`` (the first attempt of the open: a retry, an
open of what the other created, runs through).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys, time
import trio
import sediment
from sediment.engine.engine import Engine
from sediment.engine.storage import Storage
from sediment.errors import SedimentError
from sediment.wal.replication import partition_meta, replicated_log

holds = {"read", *json.loads(sys.argv[3])}
held = set()

def hold(step, *facts):
    print(step, *facts, flush=True)
    return sys.stdin.readline().strip()

def until(condition, what, deadline=30.0):
    end = time.monotonic() + deadline
    while not condition():
        if time.monotonic() > end:
            print("timeout", what, flush=True)
            sys.exit(2)
        time.sleep(0.01)

def first(step):
    if step not in holds or step in held:
        return False
    held.add(step)
    return True

def hold_engine(engine, step):
    if first(step) and hold(step) == "go-when-fenced":
        until(lambda: engine.superseded is not None, "fenced")

real_settle = Storage.settle_record
def settle(self, given):
    record = real_settle(self, given)
    if first("read"):
        hold("read", self.created)
    return record
Storage.settle_record = settle

real_probe = replicated_log.refuse_claimed_partition
def probe(*args, **kwargs):
    if first("probe"):
        hold("probe")
    return real_probe(*args, **kwargs)
replicated_log.refuse_claimed_partition = probe

real_begin = partition_meta.PartitionMetaWriter.begin_session
async def begin_session(self):
    got = await real_begin(self)
    if first("session"):
        await trio.to_thread.run_sync(hold, "session")
    return got
partition_meta.PartitionMetaWriter.begin_session = begin_session

real_open_log = Engine._open_log
def open_log(self, *args, **kwargs):
    log_ = real_open_log(self, *args, **kwargs)
    hold_engine(self, "claimed")
    return log_
Engine._open_log = open_log

real_recover = Engine._recover
def recover(self, log_):
    real_recover(self, log_)
    hold_engine(self, "recovered")
Engine._recover = recover

real_save = Storage.save_record
opening = []
def save_record(self):
    real_save(self)
    if self.recorded:
        hold_engine(opening[-1], "recorded")
Storage.save_record = save_record
real_init = Engine.__init__
def init(self, *args, **kwargs):
    real_init(self, *args, **kwargs)
    opening.append(self)
Engine.__init__ = init

options = json.loads(sys.argv[2])
if options.pop("metadata_object", False):  # the store given as an object, not by its spec
    from sediment.metadata.open_store import open_metadata_store
    options["metadata"] = open_metadata_store(options["metadata"])
try:
    eng = sediment.open(sys.argv[1], **options)
except SedimentError as exc:
    print("refused", type(exc).__name__, getattr(exc, "winner_recorded", "-"), exc, flush=True)
    sys.exit(0)
what = hold("opened", "created" if eng.storage.created else "found", eng.storage.record.engine_id)
if what == "wait-superseded":
    until(lambda: eng.superseded is not None, "superseded")
    print("superseded", type(eng.superseded).__name__, flush=True)
eng.close()
"""


class Racer:
    """One coordinator's open in a child process (stopped and killed by its PID)."""

    def __init__(self, data_dir: Path, options: dict, holds: tuple[str, ...] = ()) -> None:
        self.data_dir = data_dir
        self.stderr_path = data_dir.parent / f"{data_dir.name}.stderr"
        with open(self.stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen([sys.executable, "-c", CHILD, str(data_dir), json.dumps(options),
                                          json.dumps(list(holds))],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True)

    def at(self) -> list[str]:
        """The next step it reports (blocks until it does; its end of output is [])."""
        return self.proc.stdout.readline().split()

    def tell(self, word: str = "go") -> list[str]:
        """Let it go on from its step; the next step it reports."""
        self.proc.stdin.write(word + "\n")
        self.proc.stdin.flush()
        return self.at()

    def finish(self, timeout: float = 60.0) -> int:
        """Its exit status, once it ended; an exception in any of its threads (a traceback on
        its stderr, such as a close of a half-opened engine failing) fails the test."""
        self.proc.stdin.close()
        status = self.proc.wait(timeout)
        stderr = self.stderr_path.read_text(errors="replace")
        assert "Traceback" not in stderr, f"{self.data_dir.name} raised in a thread:\n{stderr[-4000:]}"
        return status

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
