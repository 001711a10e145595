"""Claims ahead and plugs on the log on S3 (wal/s3_claim.py, docs/formats.md "Log on S3"),
step by step: an open whose first claim loses plugs the slot a stalled writer aims at; an
open that stopped after its claim ahead leaves empty slots the next open fills; damaged
plugs and claims end in a typed error or a clean recovery, never a wrong answer; a log as
builds before session 32 wrote it still opens, and an open nobody races writes what they
read. Races go through the proxy that serializes conditional requests, as S3 does."""

from __future__ import annotations

import threading

import pytest

from sediment.errors import WalCorruption, WalFenced, WalMissing
from sediment.wal import record as rec
from sediment.wal import s3_format as fmt
from sediment.wal.s3_log import S3Log, check_log

pytestmark = [pytest.mark.s3, pytest.mark.timeout(120)]
K = rec.RecordKind


def row(i: int) -> rec.Record:
    return rec.Record(K.UPDATES, relation_id=1, t_lo=i, t_hi=i, count=1, body=f"row-{i}".encode() * 4)


def bodies(log: S3Log) -> list[bytes]:
    return [bytes(r.body) for r in log.scan() if r.kind == K.UPDATES]


def rows(*ids: int) -> list[bytes]:
    return [bytes(row(i).body) for i in ids]


class Objects:
    """The log's objects in the bucket, read and written behind the log's back."""

    def __init__(self, client, bucket: str) -> None:
        self.client, self.bucket = client, bucket

    def key(self, slot: int) -> str:
        return "log/" + fmt.slot_name(0, slot)

    def heads(self) -> dict[int, fmt.ObjectHeader]:
        keys = [o["Key"] for o in self.client.list_objects_v2(Bucket=self.bucket, Prefix="log/0/")["Contents"]]
        return {fmt.parse_name(k[len("log/"):], 0): fmt.decode_header(self.get(fmt.parse_name(k[len("log/"):], 0)))
                for k in keys}

    def get(self, slot: int) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=self.key(slot))["Body"].read()

    def put(self, slot: int, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self.key(slot), Body=data)

    def delete(self, slot: int) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self.key(slot))


@pytest.fixture
def objects(moto_server, s3_bucket) -> Objects:
    return Objects(moto_server.client(), s3_bucket[1])


def _put_path(slot: int):
    return lambda method, path: method == "PUT" and path.split("?")[0].endswith("/log/" + fmt.slot_name(0, slot))


def _get_path(slot: int):
    return lambda method, path: method == "GET" and path.split("?")[0].endswith("/log/" + fmt.slot_name(0, slot))


def test_a_lost_claim_goes_ahead_and_plugs_the_slot_a_stalled_writer_aims_at(serializing_proxy, s3_bucket, objects):
    """The old writer gets slot 3 in while the open reads the newest object (slot 2), then
    stalls with its PUT for slot 4 in flight: the open's claim at 3 loses, its claim ahead at
    5 lands, it reads slot 3 and plugs 4. The stalled PUT then fails (WalFenced), also after
    the new writer trimmed everything the old one wrote: the plug is kept, as a CLAIM is."""
    from support.wal_backends import owned

    spec = f"s3://{s3_bucket[1]}/log?endpoint={serializing_proxy.endpoint}"
    old = S3Log.open(spec, create=True, segment_bytes=4096)
    old.append([row(0)])
    old.append([row(1)])
    reading = serializing_proxy.hold_next(1, match=_get_path(2))
    opened: list = []
    opener = threading.Thread(target=lambda: opened.append(S3Log.open(spec, segment_bytes=4096)))
    opener.start()
    assert reading.reached.wait(30), "the open reads the newest object"
    old.append([row(2)])  # acknowledged: in slot 3, after the open's LIST
    stalled = serializing_proxy.hold_next(1, match=_put_path(4))
    outcome: list = []
    late = threading.Thread(target=lambda: outcome.append(_append_or_error(old, row(3))))
    late.start()
    assert stalled.reached.wait(30), "the old writer's PUT of slot 4 is in flight"
    reading.release.set()
    opener.join(30)
    new = owned(opened[0])
    try:
        assert (new.claim_rounds, new.plugs, new.epoch) == (2, 1, 6)
        heads = objects.heads()
        assert heads[4].flags == fmt.PLUG and heads[4].epoch == 5 and heads[4].first_lsn == 3
        assert heads[5].flags == fmt.CLAIM | fmt.AHEAD and heads[5].first_lsn == 2, "it names the end it saw"
        assert bodies(new) == rows(0, 1, 2) and new.end_lsn == 3
        for i in range(4, 60):
            new.append([row(i)])
        new.finish_segment()
        new.trim(new.end_lsn)
        left = objects.heads()
        assert 4 in left and 5 in left and not {1, 2, 3} & set(left), "the plug and the claim stay, data goes"
        stalled.release.set()
        late.join(30)
        assert len(outcome) == 1 and isinstance(outcome[0], WalFenced), outcome
        again = S3Log.open(spec)
        try:
            assert bytes(row(3).body) not in bodies(again) and again.start_lsn == new.start_lsn
            assert bodies(again) == bodies(new)
        finally:
            again.close()
    finally:
        stalled.release.set()
        old.close()
        new.close()


def _append_or_error(log: S3Log, r: rec.Record) -> BaseException | int:
    try:
        return log.append([r])
    except BaseException as exc:  # noqa: BLE001 - the test asserts on it
        return exc


def _stopped_open(s3_bucket, objects: Objects) -> tuple[S3Log, str]:
    """A log whose writer (returned, still open) wrote rows 0-2 in slots 1-3, and an open
    that stopped right after its claim ahead at slot 6 (it named LSN 1, the end it saw)."""
    spec = f"s3://{s3_bucket[1]}/log?endpoint={s3_bucket[0]}"
    old = S3Log.open(spec, create=True)
    for i in range(3):
        old.append([row(i)])
    objects.put(6, fmt.encode(fmt.new_header(fmt.CLAIM | fmt.AHEAD, 7, 6, 1, 0, 0), b""))
    return old, spec


def test_an_open_that_stopped_after_its_claim_ahead_leaves_slots_the_next_open_fills(s3_bucket, objects):
    old, spec = _stopped_open(s3_bucket, objects)
    try:
        end, notes, _ = check_log(spec)
        assert end == 3 and "claim(s) ahead at slots [6]" in notes[0] and "2 empty slot(s)" in notes[0], notes
        old.append([row(3)])  # the stopped open fenced nothing yet: slot 4
        new = S3Log.open(spec)
        try:
            assert (new.plugs, new.epoch, new.end_lsn) == (1, 8, 4)
            assert bodies(new) == rows(0, 1, 2, 3)
            with pytest.raises(WalFenced):
                old.append([row(4)])  # its next slot, 5, holds the new open's plug
            new.append([row(5)])
            assert check_log(spec) == (5, [], 9)
        finally:
            new.close()
        again = S3Log.open(spec)
        try:
            assert bodies(again) == rows(0, 1, 2, 3, 5) and again.plugs == 0 and again.claim_rounds == 1
        finally:
            again.close()
    finally:
        old.close()


DAMAGES = {
    "plug-flipped": (WalCorruption, "header.* is damaged"),
    "plug-cut": (WalCorruption, "header.* is damaged"),
    "plug-lsn": (WalCorruption, "does not follow"),
    "plug-epoch": (WalCorruption, "not its slot \\+ 1"),
    "plug-with-frames": (WalCorruption, "header.* is damaged"),
    "data-after-plug": (WalCorruption, "follows the plug at slot 5"),
    "claim-ahead-past-the-end": (WalCorruption, "past the LSN"),
    "plug-missing-below-data": (WalMissing, "is missing"),
    "plug-missing-at-the-end": (None, ""),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_plug_or_claim_ahead_is_a_typed_error_or_a_clean_recovery(s3_bucket, objects, damage):
    """The log of the test above after the next open: rows 0-3 in slots 1-4, the plug in 5,
    the claims ahead in 6 and 7 (and row 5 in slot 8 for the damage below data). Every
    damage ends in the typed error an open and `sediment verify` both raise, or in every
    record read back."""
    old, spec = _stopped_open(s3_bucket, objects)
    old.append([row(3)])
    old.close()
    S3Log.open(spec).close()
    plug = objects.heads()[5]
    assert plug.plug
    if damage == "plug-flipped":
        data = bytearray(objects.get(5))
        data[20] ^= 0xFF
        objects.put(5, bytes(data))
    elif damage == "plug-cut":
        objects.put(5, objects.get(5)[:40])
    elif damage in ("plug-lsn", "plug-epoch"):
        lsn, epoch = (plug.first_lsn + 1, plug.epoch) if damage == "plug-lsn" else (plug.first_lsn, plug.epoch + 1)
        objects.put(5, fmt.encode(fmt.new_header(fmt.PLUG, epoch, 5, lsn, 0, 0), b""))
    elif damage == "plug-with-frames":
        frame = rec.encode(row(9), plug.first_lsn)
        objects.put(5, fmt.encode(fmt.ObjectHeader(fmt.PLUG, 6, 5, plug.first_lsn, 1, len(frame), 0, fmt.NONE,
                                                   plug.token), frame))
    elif damage == "data-after-plug":  # the writer the plug fenced cannot have written slot 6
        frame = rec.encode(row(9), plug.first_lsn)
        objects.put(6, fmt.encode(fmt.new_header(0, plug.epoch, 6, plug.first_lsn, 1, 0), frame))
    elif damage == "claim-ahead-past-the-end":
        objects.put(6, fmt.encode(fmt.new_header(fmt.CLAIM | fmt.AHEAD, 7, 6, plug.first_lsn + 5, 0, 0), b""))
    elif damage == "plug-missing-below-data":
        writer = S3Log.open(spec)
        writer.append([row(5)])
        writer.close()
        objects.delete(5)
    else:
        objects.delete(5)  # only claims ahead above it: as if the open had stopped before plugging
    expected, message = DAMAGES[damage]
    if expected is None:
        log = S3Log.open(spec)
        try:
            assert bodies(log) == rows(0, 1, 2, 3) and log.plugs == 1
        finally:
            log.close()
        return
    with pytest.raises(expected, match=message) as verified:
        check_log(spec)
    with pytest.raises(expected, match=message) as opened:
        S3Log.open(spec)
    assert str(opened.value) == str(verified.value)


def test_a_log_as_earlier_builds_wrote_it_opens_and_an_open_nobody_races_writes_what_they_read(s3_bucket, objects):
    """Claims with epochs 1, 2 (one more than the newest object's, as before session 32) at
    the slot after the newest: the log opens, and an open that no writer races writes a plain
    CLAIM right after the newest object (flags 1, nothing an earlier build refuses), no plug."""
    frames = [rec.encode(row(i), i) for i in range(3)]
    objects.put(0, fmt.encode(fmt.new_header(fmt.CLAIM, 1, 0, 0, 0, 0), b""))
    objects.put(1, fmt.encode(fmt.new_header(0, 1, 1, 0, 2, 0), frames[0] + frames[1]))
    objects.put(2, fmt.encode(fmt.new_header(fmt.CLAIM, 2, 2, 2, 0, 0), b""))
    objects.put(3, fmt.encode(fmt.new_header(0, 2, 3, 2, 1, 0), frames[2]))
    spec = f"s3://{s3_bucket[1]}/log?endpoint={s3_bucket[0]}"
    log = S3Log.open(spec)
    try:
        assert bodies(log) == rows(0, 1, 2) and (log.claim_rounds, log.plugs, log.epoch) == (1, 0, 5)
        claim = objects.heads()[4]
        assert claim.flags == fmt.CLAIM and claim.first_lsn == 3 and claim.start_slot == 0
        log.append([row(3)])
    finally:
        log.close()
    assert check_log(spec) == (4, [], 6)
