"""Partition metadata of a replicated partition, kept in a MetadataStore (Waltz's znode).

Key ``store/partition/<id>`` (under a ZooKeeper store's root: ``<root>/store/partition/<id>``).
Value: UTF-8 JSON, documented in docs/formats.md ("Replication formats")::

    {"format": 1, "generation": 0, "session_id": 7,
     "replicas": {"127.0.0.1:7001": {"session_id": 7, "closing_hwm": -2}, ...}}

It is written only by compare-and-set, which is what makes session ids unique: two
coordinators racing for a new session cannot both win the same version. A replica's
state says which store session it is engaged in, and, once recovery resolved it, the
high-water mark that session closed at (``UNRESOLVED`` until then).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from sediment.engine.metadata import MetadataStore
from sediment.errors import ReplicationError

FORMAT = 1
UNRESOLVED = -2


def key(partition: int) -> str:
    return f"store/partition/{partition}"


@dataclass(frozen=True)
class ReplicaState:
    session_id: int = 0
    closing_hwm: int = UNRESOLVED


@dataclass
class PartitionMeta:
    generation: int = 0
    session_id: int = 0
    replicas: dict[str, ReplicaState] = field(default_factory=dict)

    def encode(self) -> bytes:
        return json.dumps({
            "format": FORMAT, "generation": self.generation, "session_id": self.session_id,
            "replicas": {r: {"session_id": s.session_id, "closing_hwm": s.closing_hwm}
                         for r, s in sorted(self.replicas.items())},
        }, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes, where: str = "") -> PartitionMeta:
        try:
            obj = json.loads(data)
            if obj.get("format") != FORMAT:
                raise ReplicationError(f"partition metadata {where} has format {obj.get('format')!r}; this "
                                       f"build reads format {FORMAT}")
            return cls(int(obj["generation"]), int(obj["session_id"]),
                       {r: ReplicaState(int(s["session_id"]), int(s["closing_hwm"]))
                        for r, s in obj["replicas"].items()})
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
