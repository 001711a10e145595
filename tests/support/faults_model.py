"""The fault campaigns' workload and model: seeded operations on the public API, and what an
engine must hold after each acknowledged call.

An operation is plain JSON (so a child process can report it on a pipe before running it):

    ["add", rel]                      add_relation
    ["drop", rel]                     drop_relation (only the optional relation; it comes back later)
    ["append", rel, rows]             append; rows are [id, time, diff]
    ["burst", [op, ...]]              appends (and at times a compaction) from concurrent threads
    ["many", {rel: rows, ...}]        append_many (one transaction)
    ["txn", {rel: rows, ...}, commit] transaction: an append per relation, then commit or abort
    ["seal", rel, t] / ["since", rel, t]
    ["compact"]                       compaction pass: batches, merges, WAL trim
    ["alter", rel, change, ...]       alter_relation: ["add", name, default] (an int64 column that
                                      appends leave out, so it reads as its default), ["rename",
                                      old, new] or ["drop", name] of such a column
    ["reopen"]                        close and open again (recovery; the first change after it
                                      folds the metadata journal into its snapshot)

The model is the consolidation of every acknowledged update: a snapshot as of ``t`` must equal
the per-row sum of diffs at times <= t, zeros dropped. A call that was in flight when the
process died may be there entirely or not at all (never in part).
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

SEGMENT_SIZES = (4224, 8192, 16384)  # the file log's segment size changes between opens (issue 23)
DROP_WEIGHT = 0.04  # the optional relation is dropped and added again
ALTER_WEIGHT = 0.04  # a relation's columns change (issue 26): a kill inside it leaves all of it or none

RELATIONS = ("a", "b")
OPTIONAL = "c"  # added and dropped again and again (with drop_weight): a new relation each time
VALUES = ("tea", "cake", "jam", "bun", "pie")


def schema_of(rel: str) -> pa.Schema:
    if rel in ("a", OPTIONAL):
        return pa.schema([("id", pa.int64()), ("item", pa.string())])
    return pa.schema([("id", pa.int64())])


def row_key(rel: str, ident: int) -> tuple:
    return (ident, VALUES[ident % len(VALUES)]) if rel in ("a", OPTIONAL) else (ident,)


def table_of(rel: str, rows: list[list[int]]) -> pa.Table:
    cols: dict[str, Any] = {"id": [r[0] for r in rows]}
    if rel in ("a", OPTIONAL):
        cols["item"] = [VALUES[r[0] % len(VALUES)] for r in rows]
    cols["time"] = [r[1] for r in rows]
    cols["diff"] = [r[2] for r in rows]
    return pa.table(cols, schema=pa.schema([*schema_of(rel), ("time", pa.int64()), ("diff", pa.int64())]))


@dataclass
class Model:
    """What every acknowledged call so far promises."""

    updates: dict[str, list[tuple[int, int, int]]] = field(default_factory=dict)
    sealed: dict[str, int] = field(default_factory=dict)
    since: dict[str, int] = field(default_factory=dict)
    extra: dict[str, list[list]] = field(default_factory=dict)  # rel -> [[name, default], ...] added by alters

    def apply(self, op: list) -> None:
        kind = op[0]
        if kind == "drop":
            for part in (self.updates, self.sealed, self.since, self.extra):
                part.pop(op[1], None)
        elif kind == "add":
            self.updates.setdefault(op[1], [])
            self.sealed.setdefault(op[1], -1)
            self.since.setdefault(op[1], 0)
        elif kind == "alter":
            self._alter(op[1], op[2:])
        elif kind == "append":
            self.updates[op[1]] += [tuple(r) for r in op[2]]
        elif kind == "burst":
            for sub in op[1]:
                self.apply(sub)
        elif kind == "many" or kind == "txn" and op[2]:
            for rel, rows in op[1].items():
                self.updates[rel] += [tuple(r) for r in rows]
        elif kind == "seal":
            self.sealed[op[1]] = max(self.sealed[op[1]], op[2])
        elif kind == "since":
            self.since[op[1]] = max(self.since[op[1]], op[2])

    def _alter(self, rel: str, change: list) -> None:
        cols = self.extra.setdefault(rel, [])
        if change[0] == "add":
            cols.append([change[1], change[2]])
        elif change[0] == "rename":
            self.extra[rel] = [[change[2] if n == change[1] else n, d] for n, d in cols]
        else:
            self.extra[rel] = [[n, d] for n, d in cols if n != change[1]]

    def columns(self, rel: str) -> list[tuple[str, Any]]:
        """The relation's columns as (name, default): its own, then those alters added."""
        return [(f.name, None) for f in schema_of(rel)] + [(n, d) for n, d in self.extra.get(rel, [])]

    def defaults(self, rel: str) -> tuple:
        return tuple(d for _n, d in self.extra.get(rel, []))

    def with_op(self, op: list | None) -> Model:
        m = copy.deepcopy(self)
        if op is not None:
            m.apply(op)
        return m

    def snapshot(self, rel: str, as_of: int) -> list[tuple]:
        sums: dict[tuple, int] = {}
        for ident, t, d in self.updates[rel]:
            if t <= as_of:
                k = (*row_key(rel, ident), *self.defaults(rel))
                sums[k] = sums.get(k, 0) + d
        return sorted((*k, d) for k, d in sums.items() if d)

    def stored(self, rel: str, since: int) -> list[tuple]:
        """Every update, unsealed ones included, with times advanced to ``since`` and
        consolidated: what :meth:`Engine.replay` must give (see :func:`replay_rows`)."""
        sums: dict[tuple, int] = {}
        for ident, t, d in self.updates[rel]:
            k = (*row_key(rel, ident), *self.defaults(rel), max(t, since))
            sums[k] = sums.get(k, 0) + d
        return sorted((*k, d) for k, d in sums.items() if d)

    def to_json(self) -> dict:
        return {"updates": self.updates, "sealed": self.sealed, "since": self.since, "extra": self.extra}

    @classmethod
    def from_json(cls, obj: dict) -> Model:
        return cls({k: [tuple(r) for r in v] for k, v in obj["updates"].items()}, dict(obj["sealed"]),
                   dict(obj["since"]), {k: [list(c) for c in v] for k, v in obj.get("extra", {}).items()})


def engine_rows(table: pa.Table) -> list[tuple]:
    cols = [table.column(n).to_pylist() for n in table.schema.names]
    return sorted(zip(*cols, strict=True))


def replay_rows(engine: Any, rel: str, since: int) -> list[tuple]:
    """The engine's stored updates of ``rel`` (``replay``), times advanced to ``since``, consolidated."""
    sums: dict[tuple, int] = {}
    for batch in engine.replay(rel):
        cols = [batch.column(n).to_pylist() for n in batch.schema.names]
        for row in zip(*cols, strict=True):
            k = (*row[:-2], max(row[-2], since))
            sums[k] = sums.get(k, 0) + row[-1]
    return sorted((*k, d) for k, d in sums.items() if d)


def next_op(rng: random.Random, model: Model, *, compact_weight: float = 0.06,
            reopen_weight: float = 0.03, burst_weight: float = 0.08, drop_weight: float = 0.0,
            alter_weight: float | None = None, burst_one_relation: float = 0.0) -> list:
    """A random operation valid against ``model`` (times above the sealed frontier, since at
    or below it). The caller's engine may lag the model only by an in-flight call that did
    not survive, and then a ``since`` can be refused: that is a typed error, not a fault.
    ``drop_weight``: how often the optional relation is dropped (and, as often, added again);
    ``burst_one_relation``: the share of bursts whose appends all go to one relation (the
    file log joins a group's consecutive appends to one relation into one record)."""
    for rel in RELATIONS:
        if rel not in model.updates:
            return ["add", rel]
    x = rng.random()
    if x < drop_weight:
        return ["drop", OPTIONAL] if OPTIONAL in model.updates else ["add", OPTIONAL]
    x -= drop_weight
    present = sorted(model.updates)
    rel = rng.choice(present)
    base = model.sealed[rel] + 1

    def rows(r: str, n: int) -> list[list[int]]:
        b = model.sealed[r] + 1
        return [[rng.randrange(24), b + rng.randrange(4), rng.choice((1, 1, 2, -1))] for _ in range(n)]

    alter_weight = ALTER_WEIGHT if alter_weight is None else alter_weight
    if x < alter_weight:
        return alter_op(rng, model, rel)
    x -= alter_weight
    if x < compact_weight:
        return ["compact"]
    x -= compact_weight
    if x < reopen_weight:
        return ["reopen"]
    x -= reopen_weight
    if x < burst_weight:  # concurrent appends from several threads (one group commit), at times with a compaction
        width = rng.randrange(2, 5)
        one = burst_one_relation and rng.random() < burst_one_relation
        subs: list[list] = [["append", r, rows(r, rng.randrange(1, 6))]
                            for r in ((rel if one else rng.choice(present)) for _ in range(width))]
        return ["burst", subs + ([["compact"]] if drop_weight and rng.random() < 0.3 else [])]
    if x < 0.45:
        return ["append", rel, rows(rel, rng.randrange(1, 12))]
    if x < 0.55:
        return ["many", {r: rows(r, rng.randrange(1, 6)) for r in present}]
    if x < 0.65:
        return ["txn", {r: rows(r, rng.randrange(1, 6)) for r in present}, rng.random() < 0.8]
    if x < 0.85:
        return ["seal", rel, base + rng.randrange(3)]
    if model.sealed[rel] > model.since[rel]:
        return ["since", rel, rng.randrange(model.since[rel], model.sealed[rel] + 1)]
    return ["seal", rel, base]


def alter_op(rng: random.Random, model: Model, rel: str) -> list:
    """An alter of ``rel``: add a defaulted column, or rename or drop one added before."""
    cols = model.extra.get(rel, [])
    x = rng.random()
    if not cols or x < 0.5:
        name = f"x{len(model.updates[rel])}_{rng.randrange(1 << 20)}"
        return ["alter", rel, "add", name, rng.randrange(100)]
    name = rng.choice(cols)[0]
    if x < 0.75 and len(name) < 60:
        return ["alter", rel, "rename", name, name + "r"]
    return ["alter", rel, "drop", name]


def run_alter(engine: Any, op: list) -> None:
    rel, change = op[1], op[2:]
    if change[0] == "add":
        engine.alter_relation(rel, add=[pa.field(change[1], pa.int64())], defaults={change[1]: change[2]})
    elif change[0] == "rename":
        engine.alter_relation(rel, rename={change[1]: change[2]})
    else:
        engine.alter_relation(rel, drop=[change[1]])


def run_op(engine: Any, op: list, on_commit: Any = None, on_sub_ack: Any = None) -> None:
    """Run one operation through the public API. ``on_commit`` is called just before a
    transaction's commit (so a watcher knows the COMMIT may now be durable); ``on_sub_ack(j)``
    when append ``j`` of a burst returned (each is acknowledged on its own)."""
    kind = op[0]
    if kind == "burst":
        import threading

        errors: list[BaseException] = []
        start = threading.Barrier(len(op[1]))  # all at once: appends that meet in the log are joined

        def one(j: int, sub: list) -> None:
            try:
                start.wait(timeout=30)
                run_op(engine, sub)
                if on_sub_ack is not None:
                    on_sub_ack(j)
            except BaseException as exc:  # noqa: BLE001 - re-raised below in the caller's thread
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(j, sub)) for j, sub in enumerate(op[1])]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return
    if kind == "add":
        if op[1] not in engine.relations():
            engine.add_relation(op[1], schema_of(op[1]))
    elif kind == "drop":
        if op[1] in engine.relations():
            engine.drop_relation(op[1])
    elif kind == "append":
        engine.append(op[1], table_of(op[1], op[2]))
    elif kind == "many":
        engine.append_many({r: table_of(r, rows) for r, rows in op[1].items()})
    elif kind == "txn":
        tx = engine.transaction()
        for r, rows in op[1].items():
            tx.append(r, table_of(r, rows))
        if on_commit is not None:
            on_commit()
        if op[2]:
            tx.commit()
        else:
            tx.abort()
    elif kind == "seal":
        engine.seal(op[1], op[2])
    elif kind == "since":
        engine.set_since(op[1], op[2])
    elif kind == "compact":
        engine.compact()
    elif kind == "alter":
        run_alter(engine, op)
    else:
        raise ValueError(f"run_op cannot run {kind!r} (reopen is the caller's)")


def as_ofs(since: int, sealed: int) -> list[int]:
    if sealed < since or sealed < 0:
        return []
    return sorted({since, (since + sealed) // 2, sealed})


@dataclass
class Check:
    """What one reopened engine showed against the model (and an in-flight call)."""

    ok: bool
    kind: str = ""  # "", "lost", "partial", "wrong"
    detail: str = ""
    model: Model | None = None  # the option that explains the engine (with or without the call in flight)


def _fitting(engine: Any, rel: str, sealed: int, since: int, options: dict[str, Model], notes: list[str]) -> set[str]:
    """The options (models) that explain what the engine holds for ``rel``."""
    ok = set()
    columns = [(c["name"], c["default"]) for c in engine.describe(rel)["columns"]]
    for name, m in options.items():
        if rel not in m.updates or sealed != m.sealed[rel] or since != m.since[rel]:
            continue
        if columns != m.columns(rel):  # an alter of a relation without rows shows in no row
            notes.append(f"{rel}: columns {columns} differ from option {name}'s {m.columns(rel)}")
            continue
        good = replay_rows(engine, rel, since) == m.stored(rel, since)
        if not good:
            notes.append(f"{rel}: stored updates differ from option {name}")
        for t in as_ofs(since, sealed) if good else ():
            got = engine_rows(engine.snapshot(rel, t))
            if got != m.snapshot(rel, t):
                good = False
                notes.append(f"{rel}@{t}: got {len(got)} rows, option {name} has {len(m.snapshot(rel, t))}")
                break
        if good:
            ok.add(name)
    return ok


def _differs(a: Model, b: Model) -> str:
    """What two models that both explain an engine differ in that a later check or
    :func:`next_op` reads ('' for nothing): the relations, frontiers and added columns, and
    each relation's updates consolidated at its ``since`` (every later ``stored`` and every
    snapshot at or above ``since`` follows from those, as ``since`` only advances)."""
    if sorted(a.updates) != sorted(b.updates):
        return f"relations {sorted(a.updates)} against {sorted(b.updates)}"
    for rel in sorted(a.updates):
        if (a.sealed[rel], a.since[rel], a.columns(rel)) != (b.sealed[rel], b.since[rel], b.columns(rel)):
            return f"{rel}: frontiers or columns"
        if a.stored(rel, a.since[rel]) != b.stored(rel, b.since[rel]):
            return f"{rel}: consolidated updates"
    return ""


def check_engine(engine: Any, acked: Model, inflight: list | None) -> Check:
    """Compare an open engine with the model: everything acknowledged is there, a call in
    flight is there entirely or not at all, frontiers never behind what was acknowledged.
    Options A (without the in-flight call) and B (with it) must explain every relation
    consistently; a mix on a transaction is a partial transaction. When several options
    explain it (an in-flight append whose updates cancel out, say), the first is kept only
    after :func:`_differs` finds nothing that would tell them apart later; else the check
    fails and says what it does not compare."""
    if inflight is not None and inflight[0] == "burst":  # each unacknowledged append of it: there or not
        subs = inflight[1]
        options = {f"A{mask:b}" if mask == 0 else f"B{mask:b}":
                   acked.with_op(["burst", [s for j, s in enumerate(subs) if mask >> j & 1]])
                   for mask in range(1 << len(subs))}
    elif inflight is not None:
        options = {"A": acked, "B": acked.with_op(inflight)}
    else:
        options = {"A": acked}
    fits: dict[str, set[str]] = {}
    notes: list[str] = []
    present = set(engine.relations())
    known = set().union(*(m.updates for m in options.values()))
    if present - known:
        return Check(False, "wrong", f"relations {sorted(present - known)} are there but were dropped or never added")
    for rel in sorted(known):
        if rel not in present:  # only an option without it (a drop acknowledged or in flight) explains that
            fits[rel] = {name for name, m in options.items() if rel not in m.updates}
            if not fits[rel]:
                return Check(False, "lost", f"relation {rel!r} is missing")
            continue
        sealed, since = engine.sealed(rel), engine.since(rel)
        if rel in acked.updates and sealed < acked.sealed[rel]:
            return Check(False, "lost", f"{rel}: sealed {sealed} < acknowledged {acked.sealed[rel]}")
        if rel in acked.updates and since < acked.since[rel]:
            return Check(False, "lost", f"{rel}: since {since} < acknowledged {acked.since[rel]}")
        fits[rel] = _fitting(engine, rel, sealed, since, options, notes)
    common = set.intersection(*fits.values()) if fits else {"A"}
    if common:
        first, *others = sorted(common)
        for other in others:
            why = _differs(options[first], options[other])
            if why:
                return Check(False, "wrong", f"options {first} and {other} both explain the engine but differ "
                                             f"for later checks ({why}): the check must compare that too")
        return Check(True, model=options[first])
    if inflight is not None and inflight[0] in ("txn", "many") and all(fits.values()):
        return Check(False, "partial", f"transaction {inflight[:1]} visible in part: {fits}")
    missing = any(not f for f in fits.values())
    return Check(False, "lost" if missing else "wrong", "; ".join(notes[:4]))
