"""Two coordinators creating the same fresh shared deployment at once, on S3 alone (log,
metadata and batches in moto's S3) and replicated (metadata in a real ZooKeeper, the log on
three storage nodes). Both read that no storage record exists; then the one that claimed
the log first is fenced by the other's claim. Whichever way that ends, one deployment is
left, made by one coordinator, which a third opens and uses; the other coordinator opens
what was made (a takeover) or gets CreatedConcurrently with nothing of its own left.

The coordinators are real processes stopped at the open's own steps (support/create_race.py)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from support.create_race import Racer
from support.replication import KEY
from support.takeover_fence import s3_options, ups

import sediment

pytestmark = pytest.mark.timeout(120)
SCHEMA = pa.schema([("k", pa.int64())])


def replicated(tmp_path, request) -> dict:
    """A replicated deployment's options: metadata in ZooKeeper, the log on three storage nodes."""
    zookeeper, zk_root = request.getfixturevalue("zookeeper"), request.getfixturevalue("zk_root")
    return {"replicas": [n.address for n in request.getfixturevalue("nodes")], "cluster_key": str(KEY),
            "metadata": f"zk://{zookeeper.hosts}{zk_root}", "blob": f"file://{tmp_path}/shared-blobs",
            "compact_interval": 3600.0}


@pytest.fixture(params=["s3", "zookeeper"])
def shared(request, tmp_path):
    """The options of a fresh shared deployment of the kind the test is run for."""
    if request.param == "s3":
        endpoint, bucket = request.getfixturevalue("s3_bucket")
        return s3_options(endpoint, bucket)
    return replicated(tmp_path, request)


def racers(tmp_path, options, holds: tuple[str, ...], first_options: dict | None = None) -> tuple[Racer, Racer]:
    """The first and the second creator, both past their read of "no storage record"."""
    first = Racer(tmp_path / "first", first_options or options, holds)
    try:
        second = Racer(tmp_path / "second", options, holds)
    except BaseException:
        first.stop()
        raise
    try:
        assert [first.at(), second.at()] == [["read", "True"]] * 2
    except BaseException:
        first.stop()
        second.stop()
        raise
    return first, second


def fenced_cause(refused: list[str]) -> bool:
    """Whether the refusal names, as its cause, the typed error of a log taken over."""
    line = " ".join(refused)
    return any(f"({name}:" in line for name in ("SessionFenced", "CoordinatorSuperseded", "WalFenced"))


def the_deployment_is_one_and_usable(tmp_path, options, creator_id: str) -> None:
    with sediment.open(tmp_path / "third", metadata=options["metadata"]) as third:
        assert not third.storage.created and third.storage.record.engine_id == creator_id
        third.add_relation("r", SCHEMA)
        third.append("r", ups([1], 1))
        third.seal("r", 1)
        assert third.snapshot("r", 1).column("k").to_pylist() == [1]


@pytest.mark.parametrize("step", ["claimed", "recovered"])
def test_the_creator_fenced_before_either_recorded_gets_created_concurrently(tmp_path, shared, step):
    """The first creator claimed the log (and, at ``recovered``, replayed it); the second
    claimed it after, fencing the first, and stops before it records the deployment. The
    first, having heard of the fence, writes no storage record and raises
    CreatedConcurrently ("open it again"), leaving no data directory; the second then
    records and serves the deployment. Before, the fenced first recorded the deployment
    and opened with its engine half closed (the close thread failed on a half-made engine),
    or on ZooKeeper failed with trio's RunFinishedError (fenced before its replay, which
    read the stopped log): now the cause named is the log's SessionFenced."""
    first, second = racers(tmp_path, shared, (step,))
    try:
        assert first.tell() == [step]
        assert second.tell() == [step]
        refused = first.tell("go-when-fenced")
        assert refused[:3] == ["refused", "CreatedConcurrently", "False"], refused
        assert fenced_cause(refused), refused
        assert first.finish() == 0 and not (tmp_path / "first").exists()
        opened = second.tell()
        assert opened[:2] == ["opened", "created"], opened
        second.tell("close")
        assert second.finish() == 0
    finally:
        first.stop()
        second.stop()
    the_deployment_is_one_and_usable(tmp_path, shared, opened[2])


def test_a_creator_fenced_after_it_recorded_but_before_its_open_returned_gets_superseded(tmp_path, shared):
    """The first creator recorded the deployment and is still opening when the second, which
    had read no record, claims the log (fencing the first), fails to record, and so opens
    what the first made. The first's open then fails with CoordinatorSuperseded, having
    released everything. Before, the fence was heard while opening and the close it started
    failed on the half-made engine; the open returned an engine nobody would close."""
    first, second = racers(tmp_path, shared, ("recorded",))
    try:
        assert first.tell() == ["recorded"]
        took = second.tell()
        assert took[:2] == ["opened", "found"], took
        refused = first.tell("go-when-fenced")
        assert refused[:2] == ["refused", "CoordinatorSuperseded"], refused
        second.tell("close")
        assert first.finish() == second.finish() == 0
    finally:
        first.stop()
        second.stop()
    the_deployment_is_one_and_usable(tmp_path, shared, took[2])


def test_a_creator_given_its_metadata_store_as_an_object_is_told_to_open_again(tmp_path, shared):
    """As when the other recorded first, but the fenced creator was given its metadata store
    as an object, which its failed open closed: no retry, CreatedConcurrently (the other
    recorded: ``winner_recorded``) says to open again. Before, the retry used the closed
    store and failed with EngineClosed, on S3 and on ZooKeeper."""
    first, second = racers(tmp_path, shared, ("recovered",), first_options={**shared, "metadata_object": True})
    try:
        assert first.tell() == ["recovered"]
        assert second.tell() == ["recovered"]
        made = second.tell()
        assert made[:2] == ["opened", "created"], made
        refused = first.tell("go-when-fenced")
        assert refused[:3] == ["refused", "CreatedConcurrently", "True"], refused
        second.tell("close")
        assert first.finish() == second.finish() == 0
    finally:
        first.stop()
        second.stop()
    the_deployment_is_one_and_usable(tmp_path, shared, made[2])


@pytest.mark.zookeeper
def test_a_creator_fenced_during_its_store_session_recovery_gets_created_concurrently(tmp_path, request):
    """Replicated: the first creator wrote its store session in ZooKeeper, and before its
    storage nodes join it the second claims the partition (a newer session) and stops
    before it records the deployment. The first's recovery meets the newer session, so its
    log open fails with SessionFenced, and the open with CreatedConcurrently. Before, the
    log open said "no write quorum ... became available within 30.0s", at once."""
    options = replicated(tmp_path, request)
    first, second = racers(tmp_path, options, ("session", "recovered"))
    try:
        assert first.tell() == ["session"]
        assert second.tell() == ["session"]
        assert second.tell() == ["recovered"]
        refused = first.tell()
        assert refused[:3] == ["refused", "CreatedConcurrently", "False"], refused
        assert "(SessionFenced:" in " ".join(refused), refused
        opened = second.tell()
        assert opened[:2] == ["opened", "created"], opened
        second.tell("close")
        assert first.finish() == second.finish() == 0
    finally:
        first.stop()
        second.stop()
    the_deployment_is_one_and_usable(tmp_path, options, opened[2])


def test_the_creator_fenced_after_the_other_recorded_opens_what_it_made(tmp_path, shared):
    """As above, but the second records the deployment (and opens) before the fenced first
    goes on: the first, finding a storage record not its own, opens what the second made,
    taking it over (the second is fenced and closes with CoordinatorSuperseded)."""
    first, second = racers(tmp_path, shared, ("recovered",))
    try:
        assert first.tell() == ["recovered"]
        assert second.tell() == ["recovered"]
        made = second.tell()
        assert made[:2] == ["opened", "created"], made
        took = first.tell("go-when-fenced")
        assert took == ["opened", "found", made[2]], took
        assert second.tell("wait-superseded") == ["superseded", "CoordinatorSuperseded"]
        first.tell("close")
        assert first.finish() == second.finish() == 0
    finally:
        first.stop()
        second.stop()
    the_deployment_is_one_and_usable(tmp_path, shared, made[2])


@pytest.mark.zookeeper
def test_a_partition_claimed_between_the_metadata_read_and_the_node_probe_is_opened(tmp_path, request):
    """Replicated: the second creator reads that ZooKeeper has no record of the log's
    partition, and before it asks the storage nodes whether they hold it, the first claims
    it. The nodes then hold a session the second's read did not show; the metadata shows it
    now, so the partition is this deployment's, and the second opens it as any later
    coordinator does (fencing the first, which gets CreatedConcurrently). Before, the second
    failed with PartitionClaimed ("they serve another engine ...")."""
    options = replicated(tmp_path, request)
    first, second = racers(tmp_path, options, ("probe", "recovered"))
    try:
        assert second.tell() == ["probe"]
        assert first.tell() == ["probe"]
        assert first.tell() == ["recovered"]
        assert second.tell() == ["recovered"]
        refused = first.tell("go-when-fenced")
        assert refused[:3] == ["refused", "CreatedConcurrently", "False"], refused
        opened = second.tell()
        assert opened[:2] == ["opened", "created"], opened
        second.tell("close")
        assert first.finish() == second.finish() == 0
    finally:
        first.stop()
        second.stop()
    the_deployment_is_one_and_usable(tmp_path, options, opened[2])
