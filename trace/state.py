"""A trace's durable state: which batch objects make up a relation, and its frontiers.

The Materialize prototype rebuilt traces by listing a directory, which cannot tell a
finished batch from a half-written or superseded one. Here the state is one small
JSON document (kept in the metadata store, replaced by compare-and-set on
``version``) and the blob store only holds objects it names; anything else under the
trace prefix is garbage. :meth:`TraceState.check_invariants` is the design's TODO 1b:
the batches form one contiguous interval ending at ``upper``, with no gap or overlap.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sediment.errors import BatchCorruption, TraceError, TraceInvariantViolation
from sediment.trace.batch import parse_batch_key

STATE_FORMAT = "sediment-trace-state"
STATE_FORMAT_VERSION = 1
_U64 = (1 << 64) - 1


@dataclass(frozen=True)
class BatchRef:
    """One batch as the state knows it: its object ``key`` (None for an interval with no
    updates, which has no object), its time interval ``[lower, upper)``, size and merge
    level. For a pending batch, ``[lower, upper)`` spans the times of its updates."""

    key: str | None
    lower: int
    upper: int
    rows: int = 0
    bytes: int = 0
    level: int = 0
    since: int = 0  # the compaction frontier its times were advanced to (its footer says the same)
    wal_first: int | None = None  # the WAL LSN range it was cut from (None when merged)
    wal_last: int | None = None
    crc: int | None = None  # CRC32C of the whole object (None in states written before it was recorded)
    footer_crc: int | None = None  # CRC32C of the Parquet footer and its 8-byte trailer
    raw: bool = False  # a bulk load's file as written (batch format version 2): consolidated on read
    time: int | None = None  # a raw run's one time and diff when its file has no such column
    diff: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The ref's fields; the checksums only when known and a raw run's fields only for one,
        so old documents keep their bytes."""
        doc = {f: getattr(self, f) for f in _REF_FIELDS}  # not dataclasses.asdict: it deep-copies every value,
        for name in _OPTIONAL:  # and a pass encodes every ref of the state on each commit
            if doc[name] is None or doc[name] is False:
                del doc[name]
        return doc


_REF_FIELDS = tuple(f.name for f in dataclasses.fields(BatchRef))
_REF_REQUIRED = ("key", "lower", "upper", "rows", "bytes", "level")  # the others were added later: defaults
_OPTIONAL = ("crc", "footer_crc", "raw", "time", "diff")


@dataclass(frozen=True)
class TraceState:
    """The compacted part of one relation.

    ``upper`` is the trace's frontier: every update at a time < upper is in
    ``batches`` (sealed = upper - 1; upper 0 means nothing sealed yet). ``since`` is
    the compaction frontier, at most the sealed time. ``pending`` holds batches of
    updates at times >= upper that were taken out of the WAL before being sealed
    (their WAL range was compacted early); the compacter folds them in when upper
    passes them. Everything of this relation in WAL records below LSN ``wal_through``
    is in ``batches`` or ``pending``. ``version`` increases with every change.
    """

    relation_id: int
    since: int = 0
    upper: int = 0
    batches: tuple[BatchRef, ...] = ()
    pending: tuple[BatchRef, ...] = ()
    wal_through: int = 0
    version: int = 0
    loads: tuple[str, ...] = ()  # the last bulk loads committed (engine/staged.py): a retried commit is a no-op
    load_facts: tuple[tuple[str, int, int | None, int | None], ...] = ()  # (job, rows, min, max time) of loads

    def load_result(self, job: str) -> tuple[int, int | None, int | None] | None:
        """A kept load's rows and min and max time, or None when not recorded (committed by a
        build that did not record them)."""
        return next((tuple(f[1:]) for f in self.load_facts if f[0] == job), None)

    @property
    def sealed(self) -> int | None:
        """The sealed frontier (``close t``), or None before the first close."""
        return self.upper - 1 if self.upper > 0 else None

    def keys(self) -> list[str]:
        """Every object key the state references (batches, then pending)."""
        return [b.key for b in (*self.batches, *self.pending) if b.key is not None]

    def _fail(self, what: str, keys: Sequence[str | None] = ()) -> TraceInvariantViolation:
        named = f" (batches {[k for k in keys]})" if keys else ""
        return TraceInvariantViolation(
            f"trace of relation {self.relation_id} v{self.version}: {what}{named}; the trace state "
            "is inconsistent: do not compact it, restore it from the metadata journal or run sediment verify"
        )

    def check_invariants(self) -> None:
        """Raise TraceInvariantViolation naming the relation and batch keys if the state is unsound."""
        for name in ("relation_id", "since", "upper", "wal_through", "version"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= _U64:
                raise self._fail(f"{name}={v!r} is not an integer in [0, 2^64)")
        if self.upper > 0 and self.since > self.upper - 1:
            raise self._fail(f"since {self.since} is beyond the sealed frontier {self.upper - 1}")
        if self.upper == 0 and self.since != 0:
            raise self._fail(f"since {self.since} is set but nothing is sealed (upper 0)")
        if not self.batches and self.upper != 0:
            raise self._fail(f"upper is {self.upper} but there are no batches covering [0, {self.upper})")
        seen: set[str] = set()
        for kind, refs in (("batch", self.batches), ("pending batch", self.pending)):
            for b in refs:
                self._check_ref(kind, b, seen)
        prev: BatchRef | None = None
        for b in self.batches:
            if prev is not None and prev.upper != b.lower:
                gap = "gap" if prev.upper < b.lower else "overlap"
                raise self._fail(
                    f"{gap} between [{prev.lower}, {prev.upper}) and [{b.lower}, {b.upper})", [prev.key, b.key]
                )
            prev = b
        if prev is not None and prev.upper != self.upper:
            raise self._fail(f"last batch ends at {prev.upper} but the trace upper is {self.upper}", [prev.key])
        for p in self.pending:
            if p.key is None:
                raise self._fail("a pending batch has no object key")
            if p.lower < self.upper:
                raise self._fail(
                    f"pending batch [{p.lower}, {p.upper}) holds times below the trace upper {self.upper}; "
                    "they should have been folded into the batches",
                    [p.key],
                )

    def _check_ref(self, kind: str, b: BatchRef, seen: set[str]) -> None:
        for name in ("lower", "upper", "rows", "bytes", "level"):
            v = getattr(b, name)
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= _U64:
                raise self._fail(f"{kind} [{b.lower}, {b.upper}) has {name}={v!r}", [b.key])
        if b.lower >= b.upper:
            raise self._fail(f"{kind} has lower {b.lower} >= upper {b.upper}", [b.key])
        for name in ("crc", "footer_crc"):
            v = getattr(b, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 1 << 32):
                raise self._fail(f"{kind} [{b.lower}, {b.upper}) has {name}={v!r}, not a 32-bit checksum", [b.key])
        if not isinstance(b.raw, bool) or (not b.raw and (b.time, b.diff) != (None, None)):
            raise self._fail(f"{kind} [{b.lower}, {b.upper}) has raw={b.raw!r}, time={b.time!r}, diff={b.diff!r}",
                             [b.key])
        for name in ("time", "diff"):
            v = getattr(b, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not -_U64 <= v <= _U64):
                raise self._fail(f"{kind} [{b.lower}, {b.upper}) has {name}={v!r}", [b.key])
        if b.key is None:
            if b.rows or b.bytes or b.crc is not None:
                raise self._fail(f"empty {kind} [{b.lower}, {b.upper}) claims {b.rows} rows, {b.bytes} bytes")
            return
        if b.key in seen:
            raise self._fail(f"{kind} key is referenced twice", [b.key])
        seen.add(b.key)
        try:
            parsed = parse_batch_key(b.key)
        except BatchCorruption as e:
            raise self._fail(f"{kind} has a malformed key: {e}", [b.key]) from e
        if parsed.relation_id != self.relation_id or (parsed.lower, parsed.upper) != (b.lower, b.upper):
            raise self._fail(
                f"{kind} key names relation {parsed.relation_id} [{parsed.lower}, {parsed.upper}) but the "
                f"ref says relation {self.relation_id} [{b.lower}, {b.upper})",
                [b.key],
            )

    def encode(self) -> bytes:
        """Canonical JSON (sorted keys, compact) with a format name and version."""
        doc = {
            "format": STATE_FORMAT,
            "format_version": STATE_FORMAT_VERSION,
            "relation_id": self.relation_id,
            "since": self.since,
            "upper": self.upper,
            "wal_through": self.wal_through,
            "version": self.version,
            "batches": [b.to_json() for b in self.batches],
            "pending": [b.to_json() for b in self.pending],
        }
        if self.loads:
            doc["loads"] = list(self.loads)
        if self.load_facts:
            doc["load_facts"] = {job: [rows, lo, hi] for job, rows, lo, hi in self.load_facts}
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> TraceState:
        """Parse and check; raises TraceError for malformed bytes and
        TraceInvariantViolation for a well-formed but unsound state."""
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise TraceError(f"trace state is not valid JSON ({e}); restore it from the metadata journal") from e
        if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT:
            raise TraceError(f"not a trace state document (format {doc.get('format') if isinstance(doc, dict) else None!r})")
        rel = doc.get("relation_id")
        if doc.get("format_version") != STATE_FORMAT_VERSION:
            raise TraceError(
                f"trace state of relation {rel}: format_version {doc.get('format_version')!r} is not supported "
                f"(this build reads {STATE_FORMAT_VERSION}); upgrade sediment"
            )
        try:
            fields = {k: doc[k] for k in ("relation_id", "since", "upper", "wal_through", "version")}
            refs = {name: tuple(BatchRef(**{f: r[f] for f in _REF_FIELDS if f in _REF_REQUIRED or f in r})
                                for r in doc[name])
                    for name in ("batches", "pending")}
        except (KeyError, TypeError) as e:
            raise TraceError(f"trace state of relation {rel} lacks or misshapes field {e}") from e
        for name, refs_ in refs.items():
            for r in refs_:
                if r.key is not None and not isinstance(r.key, str):
                    raise TraceError(f"trace state of relation {rel}: a {name} key is {r.key!r}, not a string")
        loads = doc.get("loads", [])
        if not isinstance(loads, list) or not all(isinstance(j, str) for j in loads):
            raise TraceError(f"trace state of relation {rel}: loads is {loads!r}, not a list of job names")
        state = cls(**fields, batches=refs["batches"], pending=refs["pending"], loads=tuple(loads),
                    load_facts=_load_facts(doc.get("load_facts", {}), rel))
        state.check_invariants()
        return state

    def apply_merge(
        self, start: int, stop: int, merged: BatchRef, *, inputs: Sequence[BatchRef] | None = None,
        since: int | None = None,
    ) -> TraceState:
        """The state with ``batches[start:stop]`` replaced by ``merged`` (which must cover
        exactly their interval), version + 1, and ``since`` raised to the merge's (never
        lowered). Pass the planned ``inputs`` to check that the state has not changed under
        the merge. Checked before it is returned."""
        if not 0 <= start < stop <= len(self.batches):
            raise self._fail(f"merge of batches [{start}:{stop}) is out of range (have {len(self.batches)})")
        old = self.batches[start:stop]
        if inputs is not None and tuple(inputs) != old:
            raise self._fail(
                f"merge inputs at [{start}:{stop}) changed since planning",
                [b.key for b in inputs],
            )
        if (merged.lower, merged.upper) != (old[0].lower, old[-1].upper):
            raise self._fail(
                f"merged batch [{merged.lower}, {merged.upper}) does not cover its inputs "
                f"[{old[0].lower}, {old[-1].upper})",
                [merged.key, *[b.key for b in old]],
            )
        new = dataclasses.replace(
            self,
            batches=(*self.batches[:start], merged, *self.batches[stop:]),
            since=self.since if since is None else max(since, self.since),
            version=self.version + 1,
        )
        new.check_invariants()
        return new

    def after_pass(self, *, since: int, upper: int, batches: Sequence[BatchRef], pending: Sequence[BatchRef],
                   wal_through: int) -> TraceState:
        """The state once a compaction pass took the log's records below ``wal_through``:
        its new frontiers, batches and pending runs, version + 1."""
        return dataclasses.replace(self, since=since, upper=upper, batches=tuple(batches), pending=tuple(pending),
                                   wal_through=wal_through, version=self.version + 1)

    def with_pending(self, pending: Sequence[BatchRef]) -> TraceState:
        """The state with its pending runs replaced (neighbouring runs merged), version + 1."""
        return dataclasses.replace(self, pending=tuple(pending), version=self.version + 1)

    def with_load(self, runs: Sequence[BatchRef], job: str, keep: int,
                  times: tuple[int | None, int | None] = (None, None)) -> TraceState:
        """The state with a bulk load's runs after its pending runs and the load's job name
        remembered (the last ``keep`` of them, so a retried commit is seen) with its rows and
        ``times`` (min, max: what a retry reports, e.g. for a seal), version + 1."""
        loads = (*self.loads, job)[-keep:]
        facts = tuple(f for f in self.load_facts if f[0] in loads and f[0] != job)
        return dataclasses.replace(self, pending=(*self.pending, *runs), version=self.version + 1, loads=loads,
                                   load_facts=tuple(sorted((*facts, (job, sum(r.rows for r in runs), *times)),
                                                           key=lambda f: f[0])))


def _load_facts(doc: object, rel: object) -> tuple[tuple[str, int, int | None, int | None], ...]:
    """The ``load_facts`` object of a trace state document, checked (absent in older ones)."""
    def time(t: object) -> bool:
        return t is None or isinstance(t, int) and not isinstance(t, bool)

    if not isinstance(doc, dict) or not all(
            isinstance(v, list) and len(v) == 3 and isinstance(v[0], int) and time(v[1]) and time(v[2])
            for v in doc.values()):
        raise TraceError(f"trace state of relation {rel}: load_facts is {doc!r}, not job -> [rows, min, max time]")
    return tuple((job, v[0], v[1], v[2]) for job, v in sorted(doc.items()))
