"""Partition metadata of a replicated partition, kept in a MetadataStore (Waltz's znode).

Key ``store/partition/<id>``, value UTF-8 JSON (docs/formats.md, "Partition metadata").
It is written only by compare-and-set, which is what makes session ids unique: two
coordinators racing for a new session cannot both win the same version. A replica's
state says which store session it is engaged in, and, once recovery resolved it, the
high-water mark that session closed at (``UNRESOLVED`` until then). ``owner`` names the
coordinator that took the session (host, process, data directory), so that the one it
replaced can say who serves the partition now.

Within one coordinator every write goes through one :class:`PartitionMetaWriter`: its
updates run one at a time (FIFO), each as a change applied to the freshest metadata, so
two catch-ups finishing together can neither fence the coordinator nor write back a
replica-state map read before the other's update. A compare-and-set conflict re-reads
and applies the change again; only metadata that names another session, or a newer
generation, fences (Waltz compares generations the same way).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from sediment.errors import MetadataConflict, MetadataError, ReplicationError, SessionFenced
from sediment.metadata import names
from sediment.metadata.protocol import MetadataStore

FORMAT = 1
UNRESOLVED = -2


key = names.partition_key


@dataclass(frozen=True)
class ReplicaState:
    session_id: int = 0
    closing_hwm: int = UNRESOLVED


@dataclass
class PartitionMeta:
    generation: int = 0
    session_id: int = 0
    replicas: dict[str, ReplicaState] = field(default_factory=dict)
    owner: str = ""

    def copy(self) -> PartitionMeta:
        return PartitionMeta(self.generation, self.session_id, dict(self.replicas), self.owner)

    def encode(self) -> bytes:
        obj: dict[str, Any] = {
            "format": FORMAT, "generation": self.generation, "session_id": self.session_id,
            "replicas": {r: {"session_id": s.session_id, "closing_hwm": s.closing_hwm}
                         for r, s in sorted(self.replicas.items())},
        }
        if self.owner:
            obj["owner"] = self.owner
        return json.dumps(obj, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes, where: str = "") -> PartitionMeta:
        try:
            obj = json.loads(data)
            if obj.get("format") != FORMAT:
                raise ReplicationError(f"partition metadata {where} has format {obj.get('format')!r}; this "
                                       f"build reads format {FORMAT}")
            return cls(int(obj["generation"]), int(obj["session_id"]),
                       {r: ReplicaState(int(s["session_id"]), int(s["closing_hwm"]))
                        for r, s in obj["replicas"].items()}, str(obj.get("owner", "")))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ReplicationError(f"partition metadata {where} is not valid ({exc}); restore it or delete "
                                   "the key to start the partition afresh") from exc


class PartitionMetaStore:
    """Read and compare-and-set one partition's metadata (blocking calls)."""

    def __init__(self, store: MetadataStore, partition: int) -> None:
        self.store = store
        self.partition = partition
        self.key = key(partition)

    def load(self) -> tuple[PartitionMeta, int | None]:
        """The metadata and its version (None: absent, so the first write creates it)."""
        got = self.store.get(self.key)
        if got is None:
            return PartitionMeta(), None
        return PartitionMeta.decode(got.value, self.key), got.version

    def save(self, meta: PartitionMeta, expected_version: int | None) -> int:
        """Write if still at ``expected_version``; MetadataConflict if someone else wrote."""
        return self.store.compare_and_set(self.key, meta.encode(), expected_version)


Blocking = Callable[..., Awaitable[Any]]  # runs a blocking call off the trio thread
MAX_CAS_ATTEMPTS = 64


class PartitionMetaWriter:
    """The one writer of a partition's metadata for one coordinator (see the module doc)."""

    def __init__(self, store: PartitionMetaStore, blocking: Blocking, generation: int = 0,
                 owner: str = "") -> None:
        self.store = store
        self.blocking = blocking
        self.generation = generation
        self.owner = owner
        self.session_id: int | None = None  # ours, once begin_session won
        self.meta = PartitionMeta()
        self.version: int | None = None
        self._lock = trio.Lock()  # fair: updates run in the order they were asked for
        self.writes = 0
        self.conflicts = 0

    async def begin_session(self) -> tuple[PartitionMeta, int]:
        """Take the next store session id by compare-and-set. Returns the metadata as it was
        before (its replica states drive the recovery) and the new session id. Refuses with
        SessionFenced when the metadata's generation is newer than ours."""
        def take(meta: PartitionMeta) -> None:
            self._check_generation(meta)
            meta.generation, meta.session_id, meta.owner = self.generation, meta.session_id + 1, self.owner

        async with self._lock:
            self.meta, self.version = await self.blocking(self.store.load)
            before, new = await self._write(take, "taking a store session")
            self.session_id = new.session_id
            return before, new.session_id

    async def update(self, change: Callable[[PartitionMeta], None]) -> PartitionMeta:
        """Apply ``change`` (mutates a copy) to the freshest metadata and write it; retried on
        a compare-and-set conflict. SessionFenced once the metadata is no longer ours."""
        def checked(meta: PartitionMeta) -> None:
            self._check_ours(meta)
            change(meta)

        async with self._lock:
            return (await self._write(checked, "on the partition metadata"))[1]

    async def _write(self, change: Callable[[PartitionMeta], None], what: str) -> tuple[PartitionMeta, PartitionMeta]:
        """(before, after) of ``change`` applied to a copy of the metadata held, written by
        compare-and-set; after a conflict the metadata is read again and changed again."""
        for _attempt in range(MAX_CAS_ATTEMPTS):
            before = self.meta
            new = before.copy()
            change(new)
            if new == before:
                return before, new
            try:
                self.version = await self.blocking(self.store.save, new, self.version)
            except MetadataConflict:
                self.conflicts += 1
                self.meta, self.version = await self.blocking(self.store.load)
                continue
            self.writes += 1
            self.meta = new
            return before, new
        raise MetadataError(f"partition {self.store.partition}: {MAX_CAS_ATTEMPTS} compare-and-set conflicts "
                            f"in a row {what}; another coordinator keeps writing")

    def queued(self) -> int:
        """How many metadata writes wait for the one in progress (they run one at a time)."""
        return self._lock.statistics().tasks_waiting

    async def still_ours(self) -> bool:
        """Re-read the metadata: is it still at our session and generation? A storage node
        that answers FENCED may only be confused (its storage came from elsewhere); the
        metadata decides whether this coordinator was really superseded."""
        return await self.superseded_by() is None

    async def superseded_by(self) -> PartitionMeta | None:
        """Re-read the metadata: None while it is at our session and generation, else the
        metadata that replaced ours (its ``owner`` names the coordinator that took over)."""
        async with self._lock:
            meta, version = await self.blocking(self.store.load)
            try:
                self._check_ours(meta)
            except SessionFenced:
                return meta
            self.meta, self.version = meta, version
            return None

    def _check_generation(self, meta: PartitionMeta) -> None:
        if meta.generation > self.generation:
            raise SessionFenced(f"partition {self.store.partition}: the metadata is at generation "
                                f"{meta.generation}, this coordinator at {self.generation}: it was superseded")

    def _check_ours(self, meta: PartitionMeta) -> None:
        self._check_generation(meta)
        if self.session_id is None or meta.session_id != self.session_id:
            raise SessionFenced(f"partition {self.store.partition}: the metadata moved to session "
                                f"{meta.session_id}; this coordinator's session {self.session_id} is over")
