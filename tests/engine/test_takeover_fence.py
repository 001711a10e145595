"""A coordinator replaced by a newer one on the same S3 log and S3 metadata writes nothing more
to the metadata (metadata/fence.py): its trace commits, merges and catalog writes made after
the new coordinator opened are refused with CoordinatorSuperseded, so the new coordinator's
sweep never deletes a batch a committed state names, and the old one closes itself."""

from __future__ import annotations

import pyarrow as pa
import pytest
from support.takeover_fence import SCHEMA, HeldCommit, closed_event, in_thread, keys, s3_options, ups

import sediment
from sediment.clock import ManualClock
from sediment.errors import CoordinatorSuperseded, MetadataMissing


@pytest.mark.timeout(120)
def test_a_commit_held_past_a_takeover_is_refused_and_the_swept_batch_is_never_named(tmp_path, s3_bucket):
    """The old coordinator wrote its batch, then stalled before its commit; the new one opened
    and swept the batch. Before the fence the late commit landed, naming the deleted batch:
    acknowledged keys 1-3 became unreadable (BatchCorruption) after the next open."""
    o = s3_options(*s3_bucket)
    old = sediment.open(tmp_path / "old", clock=ManualClock(), **o)
    old.add_relation("r", SCHEMA)
    for t in range(1, 4):
        old.append("r", ups([t], t))
        old.seal("r", t)
    closed = closed_event(old)
    held = HeldCommit(old)
    compacting = in_thread(old.compact)
    assert held.reached.wait(30)
    new = sediment.open(tmp_path / "new", metadata=o["metadata"], clock=ManualClock())
    assert new.swept, "the old coordinator's uncommitted batch is swept"
    held.release()
    assert compacting["done"].wait(60)
    assert isinstance(compacting.get("error"), CoordinatorSuperseded), compacting
    assert closed.wait(30) and isinstance(old.superseded, CoordinatorSuperseded)
    new.compact()  # the new coordinator's own commits go on from the state it loaded
    assert keys(new, "r", 3) == [1, 2, 3]
    new.close()
    old.close()
    with sediment.open(tmp_path / "again", metadata=o["metadata"]) as again:
        assert keys(again, "r", 3) == [1, 2, 3]


@pytest.mark.timeout(120)
def test_a_merge_held_past_a_takeover_is_refused_and_deletes_none_of_its_inputs(tmp_path, s3_bucket):
    """Before the fence the old coordinator's merge committed after the new one loaded the
    trace and deleted its inputs, which the new one still read: BatchCorruption."""
    o = s3_options(*s3_bucket)
    old = sediment.open(tmp_path / "old", clock=ManualClock(), major_compaction_quiet=None, merge_factor=1000.0, **o)
    old.add_relation("r", SCHEMA)
    for t in range(1, 5):
        old.append("r", ups([t], t))
        old.seal("r", t)
        old.wal.finish_segment()
        old.compaction.run_pass(None, merge=False)
    batches = len(old.view.get("r").trace.batches)
    assert batches >= 2
    held = HeldCommit(old, when=lambda new: len(new.batches) < batches)
    old.set_since("r", 4)
    compacting = in_thread(old.compact)
    assert held.reached.wait(30), "no merge ran"
    new = sediment.open(tmp_path / "new", metadata=o["metadata"], clock=ManualClock())
    held.release()
    assert compacting["done"].wait(60)
    assert isinstance(compacting.get("error"), CoordinatorSuperseded), compacting
    try:
        assert keys(new, "r", 4) == [1, 2, 3, 4]
        new.compact()  # the new coordinator merges them itself
        assert len(new.view.get("r").trace.batches) == 1 and keys(new, "r", 4) == [1, 2, 3, 4]
    finally:
        new.close()
        old.close()


@pytest.mark.timeout(120)
def test_a_replaced_coordinators_catalog_writes_are_refused_and_change_nothing(tmp_path, s3_bucket):
    """add_relation, alter_relation, set_since and drop_relation write the catalog only, so
    the log's claim never stopped them: before the fence each was acknowledged after the
    takeover, and the new coordinator did not see it until a reopen."""
    o = s3_options(*s3_bucket)
    old = sediment.open(tmp_path / "old", clock=ManualClock(), **o)
    old.add_relation("r", SCHEMA)
    old.add_relation("q", SCHEMA)
    old.append("r", ups([1], 1))
    old.seal("r", 1)
    new = sediment.open(tmp_path / "new", metadata=o["metadata"], clock=ManualClock())
    with pytest.raises(CoordinatorSuperseded, match="creating relation 's'"):
        old.add_relation("s", SCHEMA)
    for refused in (lambda: old.alter_relation("r", add=[pa.field("extra", pa.string())]),
                    lambda: old.set_since("r", 1), lambda: old.drop_relation("q")):
        with pytest.raises(CoordinatorSuperseded):
            refused()
    assert new.relations() == ["q", "r"] and new.schema_version("r") == 0 and new.since("r") == 0
    new.add_relation("s", SCHEMA)  # the name the refused creation tried is free
    assert new.alter_relation("r", add=[pa.field("extra", pa.string())]) == 1
    new.close()
    old.close()
    with sediment.open(tmp_path / "again", metadata=o["metadata"]) as again:
        assert again.relations() == ["q", "r", "s"] and again.schema_version("r") == 1 and again.since("r") == 0


@pytest.mark.timeout(120)
def test_an_open_refused_for_empty_metadata_leaves_the_live_coordinator_alone(tmp_path, s3_bucket):
    """The right wal= with the wrong (empty) metadata is refused (MetadataMissing); it used to
    claim the log first, so the live coordinator's next append raised WalFenced."""
    endpoint, bucket = s3_bucket
    o = s3_options(endpoint, bucket)
    live = sediment.open(tmp_path / "live", **o)
    try:
        live.add_relation("r", SCHEMA)
        live.append("r", ups([1], 1))
        with pytest.raises(MetadataMissing, match="holds LSNs"):
            sediment.open(tmp_path / "typo", **{**o, "metadata": f"s3://{bucket}/meta2?endpoint={endpoint}",
                                                 "blob": f"s3://{bucket}/blobs2"})
        live.append("r", ups([2], 2))
        live.seal("r", 2)
        assert keys(live, "r", 2) == [1, 2]
    finally:
        live.close()
