"""A writer of the log on S3 appending back to back in a process of its own: the old
coordinator an open takes the log over from (tests/wal/test_s3_log_takeover.py,
bench/s3_claim.py).

The process opens the log (a generation), appends from several threads without a pause
(so one PUT is always in flight), in its even generations trims after every 50 appends of
its first thread (as a coordinator's compaction does, keeping the log short; an open must
then also tell a slot the writer trimmed from one it did not reach), and prints each acknowledged append
(``ack GEN-THREAD-I LSN``), each failed one (``fail BODY ERROR doubt|none``: ``doubt`` for an
OutcomeUnknown) and, once every thread stopped, ``fenced GEN``. Then it waits for a line
on its stdin (:meth:`Writer.again`) and takes the log over again, as generation GEN + 1.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from dataclasses import dataclass, field

from support.waiting import poll_until

SCRIPT = """
import sys, threading
from sediment.errors import OutcomeUnknown, SedimentError
from sediment.wal import record as rec
from sediment.wal.s3_log import S3Log

spec, appenders = sys.argv[1], int(sys.argv[2])
lock = threading.Lock()

def say(*words):
    with lock:
        print(*words, flush=True)

def appender(log, gen, a):
    i = 0
    while True:
        body = f"{gen}-{a}-{i}".encode()
        try:
            lsn = log.append([rec.Record(rec.RecordKind.UPDATES, relation_id=1, t_lo=i, t_hi=i, count=1, body=body)])
        except SedimentError as exc:
            say("fail", body.decode(), type(exc).__name__, "doubt" if isinstance(exc, OutcomeUnknown) else "none")
            return
        say("ack", body.decode(), lsn)
        i += 1
        if a == 0 and gen % 2 == 0 and i % 50 == 0:
            try:
                log.trim(log.end_lsn)
            except SedimentError as exc:
                say("fail", "trim", type(exc).__name__, "none")
                return

gen = 0
while True:
    try:
        log = S3Log.open(spec, segment_bytes=4096)
    except SedimentError as exc:
        say("open-failed", type(exc).__name__)
        continue
    gen += 1
    say("open", gen, log.epoch)
    threads = [threading.Thread(target=appender, args=(log, gen, a)) for a in range(appenders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()
    say("fenced", gen)
    sys.stdin.readline()
"""


@dataclass
class Writer:
    """The writer's process and what it printed: acknowledged bodies with their LSNs, the
    appends that failed in doubt, every error's type, and per generation the appends
    acknowledged and whether it was fenced."""

    proc: subprocess.Popen
    acked: dict[bytes, int] = field(default_factory=dict)
    doubt: set[bytes] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    fenced: set[int] = field(default_factory=set)
    acks: dict[int, int] = field(default_factory=dict)
    _lines: list[str] = field(default_factory=list)

    def _pump(self) -> None:
        while self._lines:
            words = self._lines.pop(0).split()
            if words[0] == "ack":
                self.acked[words[1].encode()] = int(words[2])
                gen = int(words[1].split("-")[0])
                self.acks[gen] = self.acks.get(gen, 0) + 1
            elif words[0] == "fail":
                self.errors.append(words[2])
                if words[3] == "doubt":
                    self.doubt.add(words[1].encode())
            elif words[0] == "fenced":
                self.fenced.add(int(words[1]))

    def wait_acks(self, gen: int, n: int, timeout: float = 60) -> None:
        """Until generation ``gen`` acknowledged ``n`` appends."""
        poll_until(lambda: self._pump() or self.acks.get(gen, 0) >= n, timeout, f"the writer's generation {gen} "
                   f"acknowledging {n} appends")

    def wait_fenced(self, gen: int, timeout: float = 60) -> None:
        """Until every thread of generation ``gen`` stopped (all it acknowledged is read)."""
        poll_until(lambda: self._pump() or gen in self.fenced, timeout, f"the writer's generation {gen} fenced")

    def again(self) -> None:
        """Take the log over again (after ``fenced``)."""
        self.proc.stdin.write("again\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def start_writer(spec: str, appenders: int = 4) -> Writer:
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, spec, str(appenders)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, bufsize=1)
    writer = Writer(proc)

    def read() -> None:
        for line in proc.stdout:
            writer._lines.append(line)

    threading.Thread(target=read, daemon=True).start()
    return writer
