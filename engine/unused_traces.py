"""Trace states no catalog entry names: what an add interrupted between its two writes leaves.

An add writes the relation's empty trace state (``trace/<id>``) and then its catalog entry
(engine/catalog.py ``create``). A kill between the two, or a creation refused after the
first (the name created concurrently), leaves a state of an id no entry names; so does a
drop whose state delete failed after its entry's. Ids are never reused, so nothing will
ever read it. ``sediment verify`` notes each (a note, not a
problem: the engine opens without it). ``sediment verify --repair`` deletes the empty ones,
only where its open holds the engine alone (a local log: a shared deployment's other
coordinator may be between the two writes of its own add, and would lose the state it is
about to name); a state naming batches is reported and kept (a repair never deletes data
that verifies).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sediment.engine.catalog import RELATIONS, RelationEntry
from sediment.errors import MetadataConflict, SedimentError
from sediment.metadata import names
from sediment.metadata.protocol import Versioned
from sediment.trace.state import TraceState


@dataclass(frozen=True)
class UnusedState:
    """A ``trace/<id>`` key no catalog entry names; ``refs``: the batches it names (-1: unreadable)."""

    key: str
    relation_id: int
    version: int
    refs: int

    @property
    def empty(self) -> bool:
        return self.refs == 0

    def describe(self) -> str:
        what = (f"metadata key {self.key!r}: an unused trace state (no catalog entry names relation id "
                f"{self.relation_id}: an add stopped between its trace state and its catalog entry, or a drop "
                "between its catalog entry and its trace state)")
        if self.empty:
            return f"{what}; it is empty: `sediment verify --repair` deletes it (a local engine's)"
        if self.refs < 0:
            return f"{what}; it is unreadable, kept: delete it by hand once nothing needs it"
        return f"{what}; it names {self.refs} batch(es), kept: delete it by hand once nothing needs them"


def _state_refs(relation_id: int, value: bytes) -> int:
    try:
        state = TraceState.decode(value)
    except SedimentError:
        return -1
    if state.relation_id != relation_id:
        return -1
    return len(state.batches) + len(state.pending)


def find_unused(meta: Mapping[str, Versioned]) -> list[UnusedState]:
    """Every trace state in ``meta`` (key -> Versioned) that no catalog entry names. Empty
    when a catalog entry cannot be read: then which ids are named is not known."""
    named = set()
    for key, value in meta.items():
        if key.startswith(RELATIONS):
            try:
                named.add(RelationEntry.decode(value.value, value.version, key).id)
            except SedimentError:
                return []
    out = []
    for key in sorted(meta):
        if not key.startswith(names.TRACES):
            continue
        try:
            relation_id = names.trace_relation_id(key)
        except SedimentError:
            continue  # not a key sediment writes
        if relation_id not in named:
            out.append(UnusedState(key, relation_id, meta[key].version, _state_refs(relation_id, meta[key].value)))
    return out


def delete_unused(engine: Any) -> list[tuple[UnusedState, bool]]:
    """For ``verify --repair``, with ``engine`` opened by the repair: each unused trace state
    and whether it was deleted (empty ones only, by compare-and-delete at the version read,
    and only when the engine is not shared: no other coordinator can be adding a relation)."""
    meta = engine.storage.meta
    found = find_unused({k: got for k in meta.list(names.TRACES) if (got := meta.get(k)) is not None}
                        | {k: got for k in meta.list(RELATIONS) if (got := meta.get(k)) is not None})
    in_use = {rel.entry.id for rel in engine.view.relations.values()}
    out = []
    for unused in found:
        deleted = False
        if unused.empty and not engine.catalog.shared and unused.relation_id not in in_use:
            try:
                meta.delete(unused.key, unused.version)
                deleted = True
            except MetadataConflict:
                pass  # changed since it was read: not this repair's to judge
        out.append((unused, deleted))
    return out
