"""The catalog: which relations exist, their schemas, ids and ``since`` frontiers.

Each relation is one metadata key, ``catalog/relations/<name>``, holding a small
JSON document (docs/formats.md, "Catalog entry"). Every change is a
compare-and-set on that key's version, so the same code runs on the local journal
and on ZooKeeper. Relation ids come from a counter key and are never reused: WAL
records of a dropped relation can never be taken for those of a new relation
with the same name.

A coordinator that was replaced must write nothing more here (metadata/fence.py): an
update or drop from a version the new coordinator rewrote fails, and a creation is
confirmed by a compare-and-set of ``engine/epoch``, which the new coordinator bumped
after its claim; both refuse with CoordinatorSuperseded. Only a shared deployment (a
replicated or S3 log) can have another coordinator; a local one skips the confirmation.
A creation whose confirmation fails otherwise is removed again before the error is raised,
so a retry can create it; if even that fails, CreationUnknown (reopen to resolve it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace

import pyarrow as pa

from sediment.arrow_codec import schema_from_text, schema_to_text
from sediment.engine.schema_history import SchemaHistory
from sediment.errors import (
    CreationUnknown,
    MetadataConflict,
    MetadataCorruption,
    MetadataError,
    RelationExists,
    UnknownRelation,
)
from sediment.metadata import names
from sediment.metadata.fence import Fence, rewrite_all
from sediment.metadata.protocol import MetadataStore, Versioned

RELATIONS = names.RELATIONS
NEXT_ID = names.NEXT_RELATION_ID
EPOCH = names.EPOCH
FORMAT = "sediment.relation"
VERSION = 2  # 2: the entry carries the schema history; version 1 entries (no history) still decode
TRACED_VERSION = 3  # 3: ``trace_state``: the relation's trace state was written before the entry (see create)


@dataclass(frozen=True)
class RelationEntry:
    """A relation as the catalog records it. ``version`` is the metadata key's version."""

    name: str
    id: int
    schema: pa.Schema
    since: int = 0
    version: int = -1
    history: SchemaHistory | None = None  # None only while being built: decode and create always set it
    traced: bool = False  # its trace state was written before this entry: a missing one was lost (see create)

    @property
    def schema_history(self) -> SchemaHistory:
        return self.history if self.history is not None else SchemaHistory.initial(self.schema)

    def encode(self) -> bytes:
        doc = {
            "history": self.schema_history.to_json(),
            "format": FORMAT,
            "version": VERSION,
            "name": self.name,
            "id": self.id,
            "since": self.since,
            "schema": schema_to_text(self.schema),
        }
        if self.traced:  # only then version 3: an entry made before it keeps its version and meaning
            doc.update(version=TRACED_VERSION, trace_state=True)
        return json.dumps(doc, sort_keys=True).encode()

    @staticmethod
    def decode(raw: bytes, version: int, key: str) -> RelationEntry:
        try:
            doc = json.loads(raw)
            if doc.get("format") != FORMAT or doc.get("version") not in (1, VERSION, TRACED_VERSION):
                raise ValueError(f"format {doc.get('format')!r} version {doc.get('version')!r}")
            traced = doc.get("trace_state", False)
            if traced is not (doc["version"] == TRACED_VERSION):
                raise ValueError(f"version {doc['version']} with trace_state {traced!r}")
            schema = schema_from_text(doc["schema"])
            history = SchemaHistory.from_json(doc["history"]) if "history" in doc else SchemaHistory.initial(schema)
            return RelationEntry(doc["name"], int(doc["id"]), schema, int(doc["since"]), version, history, traced)
        except (ValueError, KeyError, TypeError, IndexError, pa.ArrowInvalid) as exc:
            raise MetadataCorruption(f"catalog entry {key!r} is unreadable: {exc}") from None


class Catalog:
    """Relations in a MetadataStore. ``fence`` refuses the writes of a replaced coordinator;
    ``shared``: another coordinator may take over (creations are confirmed, see above)."""

    def __init__(self, store: MetadataStore, fence: Fence | None = None, *, shared: bool = True):
        self.store = store
        self.fence = fence if fence is not None else Fence()
        self.shared = shared
        self._epoch: Versioned | None = None  # engine/epoch as this coordinator last wrote it

    def load(self, *, take_over: bool = False) -> dict[str, RelationEntry]:
        """Every relation's entry; ``take_over``: each entry rewritten first (metadata/fence.py),
        so that a replaced coordinator's later writes to it fail."""
        keys = self.store.list(RELATIONS)
        got = rewrite_all(self.store, keys) if take_over else [self.store.get(k) for k in keys]
        out = {}
        for key, value in zip(keys, got, strict=True):
            if value is not None:
                entry = RelationEntry.decode(value.value, value.version, key)
                out[entry.name] = entry
        return out

    def get(self, name: str) -> RelationEntry:
        got = self.store.get(RELATIONS + name)
        if got is None:
            raise UnknownRelation(f"no relation named {name!r}; `sediment relation list` shows the relations")
        return RelationEntry.decode(got.value, got.version, RELATIONS + name)

    def _bump(self, key: str) -> Versioned:
        """Atomically increment a counter key; the new value and version."""
        while True:
            got = self.store.get(key)
            value = str((int(got.value) if got else 0) + 1).encode()
            try:
                return Versioned(value, self.store.compare_and_set(key, value, got.version if got else None))
            except MetadataConflict:
                continue

    def next_epoch(self) -> int:
        """A number no earlier opening of this engine used: the high bits of transaction ids.
        Bumped after the log claim: creations of a coordinator opened earlier fail from then on."""
        self._epoch = self._bump(EPOCH)
        return int(self._epoch.value)

    def create(self, name: str, schema: pa.Schema, prepare: Callable[[int], object] | None = None) -> RelationEntry:
        """Write a new relation's entry under a fresh id. ``prepare(id)`` first writes what must
        exist before the entry does (the engine: the relation's empty trace state), and the entry
        then says so (``trace_state``): a crash between the two leaves only an unused trace state
        of an id no entry names, and a trace state missing under an entry was lost, not never
        written (engine/engine.py refuses to open without it)."""
        if self.store.get(RELATIONS + name) is not None:
            raise RelationExists(f"relation {name!r} already exists; drop it first or pick another name")
        entry = RelationEntry(name, int(self._bump(NEXT_ID).value), schema, history=SchemaHistory.initial(schema),
                              traced=prepare is not None)
        if prepare is not None:
            prepare(entry.id)
        try:
            version = self.store.compare_and_set(RELATIONS + name, entry.encode(), None)
        except MetadataConflict:
            raise RelationExists(f"relation {name!r} already exists (created concurrently)") from None
        self._confirm(name, version)
        return replace(entry, version=version)

    def _confirm(self, name: str, version: int) -> None:
        """Still the coordinator after creating ``name``? A compare-and-set of ``engine/epoch``
        (same value) from the version this one wrote, or, when it fails, a read of the epoch
        showing this one's value (a newer open writes a larger one). If a newer open bumped it, its
        listing of the catalog may have missed the entry: the entry is removed again unless
        the new coordinator already rewrote it (then it holds and serves the relation). Any
        other failure removes the entry too and is raised: nothing was created."""
        if self._epoch is None or not self.shared:  # a tool, or a local engine: no other coordinator
            return
        try:
            self._epoch = Versioned(self._epoch.value,
                                    self.store.compare_and_set(EPOCH, self._epoch.value, self._epoch.version))
            return
        except MetadataError as e:  # a conflict too: an earlier confirmation of unknown outcome may have landed
            held = self._epoch_held()
            if held:
                return
            if held is None and not isinstance(e, MetadataConflict):
                self._undo(name, version, e)
        try:
            self.store.delete(RELATIONS + name, version)
            held = "it was removed again"
        except MetadataConflict:
            held = "the new coordinator holds it"
        raise self.fence.refuse(f"creating relation {name!r} ({held})")

    def _epoch_held(self) -> bool | None:
        """After a failed confirmation: True (and its version kept) when the epoch
        still holds this coordinator's value, False when a newer open wrote a larger one, None
        when it cannot be read."""
        try:
            got = self.store.get(EPOCH)
        except MetadataError:
            return None
        if got is None or got.value != self._epoch.value:
            return False
        self._epoch = got
        return True

    def _undo(self, name: str, version: int, err: MetadataError) -> None:
        """Remove ``name``'s entry after its confirmation failed with ``err`` and the epoch could
        not be read, then raise ``err`` (nothing created); a new coordinator's rewrite of the
        entry returns (the caller refuses as superseded)."""
        try:
            self.store.delete(RELATIONS + name, version)
        except MetadataConflict:
            return
        except MetadataError as e:
            raise CreationUnknown(f"relation {name!r}: its catalog entry was written, but neither confirmed nor "
                                  f"removed ({type(err).__name__}, then {type(e).__name__}: {e}); reopen the "
                                  "engine, which serves the relation if the entry is there") from e
        raise err

    def update(self, entry: RelationEntry) -> RelationEntry:
        """Write a changed entry; CoordinatorSuperseded if another coordinator rewrote it since it was read."""
        try:
            version = self.store.compare_and_set(RELATIONS + entry.name, entry.encode(), entry.version)
        except MetadataConflict:
            raise self.fence.refuse(f"changing relation {entry.name!r}") from None
        return replace(entry, version=version)

    def drop(self, entry: RelationEntry) -> None:
        try:
            self.store.delete(RELATIONS + entry.name, entry.version)
        except MetadataConflict:
            raise self.fence.refuse(f"dropping relation {entry.name!r}") from None
