"""A replaced coordinator's trace commit of unknown outcome, read back after the new
coordinator's take-over rewrite (same bytes, a newer version), counts as landed at the
version it made, never the rewrite's: its next commit is refused as superseded."""
from dataclasses import replace

import pytest

from sediment.blob.memory import MemoryBlobStore
from sediment.errors import CoordinatorSuperseded, MetadataUnavailable
from sediment.metadata.memory import MemoryMetadataStore
from sediment.trace.state import TraceState
from sediment.trace.store import TraceStore, state_key


def test_read_back_after_a_takeover_rewrite_is_not_a_commit():
    meta, blobs = MemoryMetadataStore(), MemoryBlobStore()
    old = TraceStore(meta, blobs)
    s0 = old.load_many([1], take_over=True)[0]
    s1 = replace(s0, wal_through=5, version=s0.version + 1)
    plain = meta.compare_and_set
    new = TraceStore(meta, blobs)

    def lost_answer(key, value, expected):
        meta.compare_and_set = plain
        plain(key, value, expected)          # the write lands...
        new.load_many([1], take_over=True)   # ...a new coordinator takes over (rewrites the same bytes)...
        raise MetadataUnavailable("no answer")  # ...and the old one never heard back

    meta.compare_and_set = lost_answer
    old.commit(s1)  # read back: same bytes -> it landed (then the take-over rewrote it)
    assert TraceState.decode(meta.get(state_key(1)).value).wal_through == 5
    s2 = replace(s1, wal_through=9, version=s1.version + 1)
    with pytest.raises(CoordinatorSuperseded):
        old.commit(s2)  # must be refused: the new coordinator rewrote the key


def test_conflict_after_unresolved_commit_and_takeover_is_superseded():
    meta, blobs = MemoryMetadataStore(), MemoryBlobStore()
    old = TraceStore(meta, blobs)
    s0 = old.load_many([1], take_over=True)[0]
    s1 = replace(s0, wal_through=5, version=s0.version + 1)
    plain, plain_get = meta.compare_and_set, meta.get
    new = TraceStore(meta, blobs)

    def lost_answer(key, value, expected):
        meta.compare_and_set = plain
        plain(key, value, expected)
        raise MetadataUnavailable("no answer")

    def no_get(key):
        meta.get = plain_get
        raise MetadataUnavailable("no answer")

    meta.compare_and_set, meta.get = lost_answer, no_get
    with pytest.raises(MetadataUnavailable):
        old.commit(s1)
    new.load_many([1], take_over=True)  # the take-over rewrites S1 as it is
    s2 = replace(s1, wal_through=9, version=s1.version + 1)
    with pytest.raises(CoordinatorSuperseded):
        old.commit(s2)
    assert old.fence.replaced is not None
