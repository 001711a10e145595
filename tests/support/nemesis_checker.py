"""The checker of the nemesis campaign (bench/nemesis.py): pure logic over what the clients
saw and what the cluster holds at the end, no I/O.

Every row a client sends is one int64 key, unique over the run, so the final state is a map
key -> diff sum. A client's history is a list of calls, each with its start and end on the
host's monotonic clock (one clock for every process of a Linux host), so real-time order
across clients can be compared:

* an **append** (one keyed ``append_once``, retried with its key) ends ``ok``,
  ``unknown`` (OutcomeUnknown, a transport failure, anything not saying nothing was
  written) or ``refused`` (a NothingWritten error: nothing of it may be there);
* a **read** is a snapshot at ``as_of`` (the set of keys it showed), a **sealed** is what a
  ``sealed()`` call answered or a seal that was acknowledged (the frontier is at least that).

What must hold, each figure counted (every one must be 0):

* ``lost``: an acknowledged append with a row missing at the end;
* ``doubled``: a row present more than once (whatever the append's outcome);
* ``phantom``: a row present, or shown by a read, that no client ever sent, or shown by a
  read at ``as_of`` below the time it was sent at;
* ``torn``: an append present in part;
* ``refused_present``: an append refused with nothing written, present at the end;
* ``non_monotonic``: a read missing a row that an earlier read of the same client at a
  smaller or equal ``as_of`` showed, or a frontier seen lower than one seen (by anyone)
  before the call began;
* ``stale``: a read missing a row acknowledged before it began at a time <= its ``as_of``;
* ``divergent``: a member whose snapshot at the end differs from the cluster's;
* ``hung``: a call that did not end within its bound;
* ``untyped``: calls that failed with an exception not from ``sediment.errors``, by type;
* ``unexpected``: calls that failed with one of sediment's errors outside ``expected`` (the
  refusals the workload provokes and the outcome-unknown or unavailable answers a client may
  get after its deadline), by type: a read told that a batch is missing, say.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

OK, UNKNOWN, REFUSED = "ok", "unknown", "refused"


@dataclass(frozen=True)
class Append:
    """One keyed append as its client saw it (after every retry of its key)."""

    client: str
    seq: int
    relation: str
    keys: tuple[int, ...]
    time: int
    start: float
    end: float
    outcome: str


@dataclass(frozen=True)
class Read:
    """A snapshot of ``relation`` at ``as_of`` read by ``client``."""

    client: str
    relation: str
    as_of: int
    keys: frozenset[int]
    start: float
    end: float


@dataclass(frozen=True)
class Sealed:
    """A frontier seen by ``client``: ``sealed()``'s answer, or (``at_least``) an acknowledged
    seal's time, which the frontier is at or past (a resent seal that finds it past succeeds)."""

    client: str
    relation: str
    value: int
    start: float
    end: float
    at_least: bool = False


@dataclass(frozen=True)
class Call:
    """Any call, for the hang and type counts: its error's class name (None: it returned),
    whether that class is one of sediment's, and whether it passed its bound."""

    kind: str
    error: str | None = None
    typed: bool = True
    hung: bool = False
    took: float = 0.0  # seconds
    message: str = ""  # the error's first line


@dataclass
class History:
    appends: list[Append] = field(default_factory=list)
    reads: list[Read] = field(default_factory=list)
    sealed: list[Sealed] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)


@dataclass
class Figures:
    lost: int = 0
    doubled: int = 0
    phantom: int = 0
    torn: int = 0
    refused_present: int = 0
    non_monotonic: int = 0
    stale: int = 0
    divergent: int = 0
    hung: int = 0
    untyped: Counter = field(default_factory=Counter)
    unexpected: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)  # one line per violation, the first few
    outcomes: Counter = field(default_factory=Counter)  # appends by outcome
    errors: Counter = field(default_factory=Counter)  # typed errors by class name
    reads: int = 0  # snapshots read
    sealed: int = 0  # sealed() answers
    seals: int = 0  # seals acknowledged
    slowest: float = 0.0  # the longest call, seconds

    MUST_BE_ZERO = ("lost", "doubled", "phantom", "torn", "refused_present", "non_monotonic", "stale", "divergent",
                    "hung")

    def violations(self) -> int:
        return (sum(getattr(self, name) for name in self.MUST_BE_ZERO) + sum(self.untyped.values())
                + sum(self.unexpected.values()))

    def note(self, line: str) -> None:
        if len(self.examples) < 20:
            self.examples.append(line)


def check(history: History, final: Mapping[str, Mapping[int, int]],
          members: Mapping[str, Mapping[str, Mapping[int, int]]], expected: Iterable[str] | None = None) -> Figures:
    """The figures of one run. ``final``: relation -> key -> diff sum at the end, read through
    the cluster; ``members``: member -> relation -> the same, read through that member;
    ``expected``: the class names of the typed errors a call may end with (None: any)."""
    f = Figures(reads=len(history.reads), sealed=sum(not s.at_least for s in history.sealed),
                seals=sum(s.at_least for s in history.sealed))
    sent = {k: (a.relation, a.time) for a in history.appends for k in a.keys}
    _check_final(history.appends, final, sent, f)
    _check_reads(history, sent, f)
    _check_sealed(history.sealed, f)
    for member, state in members.items():
        for relation in sorted(set(final) | set(state)):
            if dict(state.get(relation, {})) != dict(final.get(relation, {})):
                f.divergent += 1
                f.note(f"divergent: {relation} through {member}")
    for c in history.calls:
        f.hung += c.hung
        f.slowest = max(f.slowest, c.took)
        if c.error is not None:
            (f.errors if c.typed else f.untyped)[c.error] += 1
            if c.typed and expected is not None and c.error not in expected:
                f.unexpected[c.error] += 1
                f.note(f"unexpected: a {c.kind} failed with {c.error}: {c.message}")
    return f


def _check_final(appends: list[Append], final: Mapping[str, Mapping[int, int]],
                 sent: Mapping[int, tuple[str, int]], f: Figures) -> None:
    for a in appends:
        f.outcomes[a.outcome] += 1
        counts = [final.get(a.relation, {}).get(k, 0) for k in a.keys]
        if any(c > 1 for c in counts):
            f.doubled += 1
            f.note(f"doubled: {a.client} #{a.seq} ({a.outcome}) in {a.relation}: {counts}")
        present = sum(1 for c in counts if c >= 1)
        if 0 < present < len(counts):
            f.torn += 1
            f.note(f"torn: {a.client} #{a.seq} ({a.outcome}) in {a.relation}: {counts}")
        elif a.outcome == OK and present == 0:
            f.lost += 1
            f.note(f"lost: {a.client} #{a.seq} in {a.relation} at t={a.time}, acknowledged at {a.end:.3f}")
        elif a.outcome == REFUSED and present:
            f.refused_present += 1
            f.note(f"refused but present: {a.client} #{a.seq} in {a.relation}")
    for relation, rows in final.items():
        for k, diff in rows.items():
            if diff and sent.get(k, (None,))[0] != relation:
                f.phantom += 1
                f.note(f"phantom: key {k} in {relation}, never sent there")


def _check_reads(history: History, sent: Mapping[int, tuple[str, int]], f: Figures) -> None:
    by_client: dict[tuple[str, str], list[Read]] = defaultdict(list)
    for r in history.reads:
        by_client[(r.client, r.relation)].append(r)
        bad = [k for k in r.keys if sent.get(k, (None, 0))[0] != r.relation or sent[k][1] > r.as_of]
        if bad:
            f.phantom += 1
            f.note(f"phantom: {r.client} read {r.relation} at {r.as_of} and saw {len(bad)} rows never sent there "
                   f"at or before it (e.g. key {bad[0]})")
    for (client, relation), reads in by_client.items():
        reads.sort(key=lambda r: r.start)
        for j, later in enumerate(reads):
            for earlier in reads[:j]:
                if earlier.end <= later.start and earlier.as_of <= later.as_of and not earlier.keys <= later.keys:
                    f.non_monotonic += 1
                    f.note(f"non-monotonic: {client} read {relation} at {later.as_of} without "
                           f"{len(earlier.keys - later.keys)} rows its read at {earlier.as_of} showed")
                    break
    acked = sorted((a for a in history.appends if a.outcome == OK), key=lambda a: a.end)
    for r in history.reads:
        missing = [a for a in acked if a.end < r.start and a.relation == r.relation and a.time <= r.as_of
                   and not set(a.keys) <= r.keys]
        if missing:
            f.stale += 1
            f.note(f"stale: {r.client} read {r.relation} at {r.as_of} without {len(missing)} appends acknowledged "
                   f"before it began (e.g. {missing[0].client} #{missing[0].seq} at t={missing[0].time})")


def _check_sealed(seen: Iterable[Sealed], f: Figures) -> None:
    """A frontier never goes back: a ``sealed()`` that began after a call that saw it at ``v``
    ended answers ``v`` or more."""
    by_relation: dict[str, list[Sealed]] = defaultdict(list)
    for s in seen:
        by_relation[s.relation].append(s)
    for relation, obs in by_relation.items():
        ended = sorted(obs, key=lambda s: s.end)
        i, highest, by = 0, None, None
        for s in sorted(obs, key=lambda s: s.start):
            while i < len(ended) and ended[i].end < s.start:
                if highest is None or ended[i].value > highest:
                    highest, by = ended[i].value, ended[i]
                i += 1
            if highest is not None and s.value < highest and not s.at_least:
                f.non_monotonic += 1
                f.note(f"non-monotonic: {s.client} saw {relation} sealed at {s.value} after {by.client} saw "
                       f"{highest}")
