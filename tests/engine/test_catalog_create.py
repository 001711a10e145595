"""add_relation never leaves a half-created relation, and a local engine (no other
coordinator can exist) does not confirm creations with a write of ``engine/epoch``."""
import pyarrow as pa
import pytest

import sediment
from sediment.engine.catalog import Catalog
from sediment.errors import CoordinatorSuperseded, CreationUnknown, MetadataUnavailable, OutcomeUnknown
from sediment.metadata.memory import MemoryMetadataStore
from sediment.metadata.names import EPOCH, RELATIONS

SCHEMA = pa.schema([("id", pa.int64())])


def test_local_add_relation_writes_no_epoch(tmp_path):
    with sediment.open(tmp_path / "d", compact_interval=None) as eng:
        meta = eng.catalog.store
        plain = meta.compare_and_set
        keys = []

        def counting(key, value, expected):
            keys.append(key)
            return plain(key, value, expected)

        meta.compare_and_set = counting
        eng.add_relation("r", SCHEMA)
        assert EPOCH not in keys and RELATIONS + "r" in keys
        eng.append("r", pa.table({"id": [1], "time": [1], "diff": [1]}))
        assert eng.relations() == ["r"]


def shared_catalog() -> tuple[MemoryMetadataStore, Catalog]:
    meta = MemoryMetadataStore()
    catalog = Catalog(meta, shared=True)
    catalog.next_epoch()
    return meta, catalog


def failing_epoch(meta, *, read_fails: bool = False, delete_fails: bool = False):
    """Every compare-and-set of the epoch fails (after landing); optionally reads of it and deletes too."""
    plain_cas, plain_get, plain_delete = meta.compare_and_set, meta.get, meta.delete

    def cas(key, value, expected):
        if key == EPOCH:
            plain_cas(key, value, expected)
            raise MetadataUnavailable("no answer")
        return plain_cas(key, value, expected)

    def get(key):
        if key == EPOCH and read_fails:
            raise MetadataUnavailable("no answer")
        return plain_get(key)

    def delete(key, expected=None):
        if delete_fails:
            raise MetadataUnavailable("no answer")
        return plain_delete(key, expected)

    meta.compare_and_set, meta.get, meta.delete = cas, get, delete
    return lambda: setattr(meta, "compare_and_set", plain_cas) or setattr(meta, "get", plain_get) \
        or setattr(meta, "delete", plain_delete)


def test_confirmation_of_unknown_outcome_read_back_creates():
    meta, catalog = shared_catalog()
    failing_epoch(meta)
    entry = catalog.create("r", SCHEMA)  # the epoch still holds this coordinator's value: created
    assert meta.get(RELATIONS + "r").version == entry.version
    catalog.create("s", SCHEMA)  # the epoch's version was taken from the read: the next confirmation holds
    assert catalog.fence.replaced is None


def test_confirmation_failed_and_unreadable_leaves_nothing():
    meta, catalog = shared_catalog()
    restore = failing_epoch(meta, read_fails=True)
    with pytest.raises(MetadataUnavailable):
        catalog.create("r", SCHEMA)
    assert meta.get(RELATIONS + "r") is None  # nothing half-created
    restore()
    assert catalog.create("r", SCHEMA).name == "r"  # a retry creates it (the lost epoch write landed: read back)
    assert catalog.fence.replaced is None


def test_a_newer_epoch_refuses_and_removes_the_entry():
    meta, catalog = shared_catalog()
    Catalog(meta, shared=True).next_epoch()  # a newer open
    with pytest.raises(CoordinatorSuperseded):
        catalog.create("r", SCHEMA)
    assert meta.get(RELATIONS + "r") is None


def test_confirmation_and_removal_failed_is_outcome_unknown():
    meta, catalog = shared_catalog()
    failing_epoch(meta, read_fails=True, delete_fails=True)
    with pytest.raises(CreationUnknown) as info:
        catalog.create("r", SCHEMA)
    assert isinstance(info.value, OutcomeUnknown)
    assert catalog.fence.replaced is None
