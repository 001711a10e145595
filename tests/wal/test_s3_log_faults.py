"""The log on S3 (wal/s3_log.py) against what S3 really does, through tests/faulty_proxy.py in
front of moto: a PUT whose answer is lost after it landed, 409 conflicts, 5xx past botocore's
budget, and a stalled writer fenced by a newer one. Race outcomes are asserted only through
the proxy that serializes conditional requests (moto alone checks conditions without a lock).
Each test counts acknowledged records lost and records doubled: both must be 0."""

from __future__ import annotations

import threading
import uuid

import pytest

from sediment.errors import WalFenced
from sediment.wal import record as rec
from sediment.wal import s3_format as fmt
from sediment.wal.s3_log import S3Log

pytestmark = [pytest.mark.s3, pytest.mark.timeout(120)]
K = rec.RecordKind


def row(i: int) -> rec.Record:
    return rec.Record(K.UPDATES, relation_id=1, t_lo=i, t_hi=i, count=1, body=f"row-{i}".encode() * 4)


def is_log_put(method: str, path: str) -> bool:
    return method == "PUT" and "/log/0/" in path


def bodies(log: S3Log) -> list[bytes]:
    return [bytes(r.body) for r in log.scan() if r.kind == K.UPDATES]


def assert_once_each(log: S3Log, acked: list[rec.Record]) -> None:
    """0 acknowledged lost, 0 doubled."""
    seen = bodies(log)
    for r in acked:
        assert seen.count(bytes(r.body)) == 1, (r.t_lo, seen.count(bytes(r.body)))


@pytest.fixture
def spec_at(s3_bucket):
    _, bucket = s3_bucket

    def spec(endpoint: str) -> str:
        return f"s3://{bucket}/log?endpoint={endpoint}"

    return spec


@pytest.mark.parametrize("fault", ["drop-once", "drop-every-attempt", "409", "503-past-budget"])
def test_a_put_whose_answer_is_lost_or_refused_is_neither_lost_nor_doubled(faulty_proxy, spec_at, fault, caplog):
    caplog.set_level("INFO", logger="sediment.wal.s3_objects")
    log = S3Log.open(spec_at(faulty_proxy.endpoint), create=True, max_attempts=3, read_timeout=5.0)
    acked = [row(0)]
    log.append([acked[0]])
    if fault == "drop-once":  # botocore resends; the resend gets 412 on our own bytes
        faulty_proxy.drop_response_next(1, match=is_log_put)
    elif fault == "drop-every-attempt":  # outcome unknown after every attempt: resolved by reading
        faulty_proxy.drop_response_next(3, match=is_log_put)
    elif fault == "409":
        faulty_proxy.fail_next(2, status=409, code="ConditionalRequestConflict", match=is_log_put)
    else:
        faulty_proxy.fail_next(3, status=503, code="ServiceUnavailable", match=is_log_put)
    for i in range(1, 4):
        r = row(i)
        log.append([r])
        acked.append(r)
    assert faulty_proxy.pending() == 0 and faulty_proxy.log.faults, "the fault was injected"
    if fault == "drop-once":
        assert "an earlier attempt of the PUT" in caplog.text, "the resend's 412 was recognised as our own write"
    assert_once_each(log, acked)
    log.close()
    log = S3Log.open(spec_at(faulty_proxy.endpoint))
    try:
        assert_once_each(log, acked)
        assert len(bodies(log)) == len(acked)
    finally:
        log.close()


def test_a_stalled_writer_is_fenced_by_the_next_open_and_writes_nothing_more(serializing_proxy, spec_at,
                                                                           s3_bucket, moto_server):
    spec = spec_at(serializing_proxy.endpoint)
    old = S3Log.open(spec, create=True)
    acked = [row(0), row(1)]
    for r in acked:
        old.append([r])
    hold = serializing_proxy.hold_next(1, match=is_log_put)
    late = row(2)
    outcome: list[BaseException | int] = []

    def stalled() -> None:
        try:
            outcome.append(old.append([late]))
        except BaseException as exc:  # noqa: BLE001 - asserted below
            outcome.append(exc)

    t = threading.Thread(target=stalled)
    t.start()
    assert hold.reached.wait(30), "the old writer's PUT reached the proxy"
    new = S3Log.open(spec)  # claims the slot the stalled PUT is aimed at
    try:
        hold.release.set()
        t.join(30)
        assert len(outcome) == 1 and isinstance(outcome[0], WalFenced), outcome
        with pytest.raises(WalFenced):
            old.append([row(3)])
        assert_once_each(new, acked)
        assert bytes(late.body) not in bodies(new)
        client = moto_server.client()
        _, bucket = s3_bucket
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="log/0/")["Contents"]]
        heads = [fmt.decode_header(client.get_object(Bucket=bucket, Key=k)["Body"].read()) for k in keys]
        claim = max(h.slot for h in heads if h.claim)
        assert all(h.epoch == new.epoch for h in heads if h.slot >= claim), "nothing of the old epoch after the claim"
        more = row(4)
        new.append([more])
        assert_once_each(new, acked + [more])
    finally:
        old.close()
        new.close()


def test_two_opens_racing_for_one_log_end_with_one_writer(serializing_proxy, spec_at):
    """Each open claims; the later claim fences the earlier one, whichever order S3 picks."""
    spec = spec_at(serializing_proxy.endpoint)
    first = S3Log.open(spec, create=True)
    first.append([row(0)])
    opened: list[S3Log] = []
    lock = threading.Lock()

    def opener() -> None:
        log = S3Log.open(spec)
        with lock:
            opened.append(log)

    threads = [threading.Thread(target=opener) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert len(opened) == 4 and len({log.epoch for log in opened}) == 4
        winner = max(opened, key=lambda log: log.epoch)
        for log in [first, *opened]:
            if log is not winner:
                with pytest.raises(WalFenced):
                    log.append([row(9)])
        r = row(10)
        winner.append([r])
        assert bodies(winner) == [bytes(row(0).body), bytes(r.body)]
    finally:
        for log in [first, *opened]:
            log.close()


def test_a_bad_spec_is_refused_with_a_typed_error(tmp_path):
    from sediment.errors import InvalidArgument

    for spec in ["s3://", "s3:///x", f"s3://b/p?endpoint=a&endpoint=b&x={uuid.uuid4()}", "file:///x"]:
        with pytest.raises(InvalidArgument):
            S3Log.open(spec, create=True)


def test_a_resent_put_whose_slot_was_trimmed_meanwhile_is_outcome_unknown(faulty_proxy, spec_at, s3_bucket,
                                                                         moto_server):
    """A PUT landed, its answer was lost, the resend met 412, and before the writer could read
    the slot back it was deleted (as a new writer's trim does): the append may be in the log,
    so it is reported OutcomeUnknown, never NothingWritten, and the log writes nothing more."""
    from sediment.errors import NothingWritten, OutcomeUnknown, WalTakenOverInFlight

    _, bucket = s3_bucket
    log = S3Log.open(spec_at(faulty_proxy.endpoint), create=True, max_attempts=3, read_timeout=5.0)
    try:
        log.append([row(0)])
        slot = f"log/{fmt.slot_name(0, 2)}"
        faulty_proxy.drop_response_next(1, match=is_log_put)
        hold = faulty_proxy.hold_next(1, match=lambda method, path: method == "GET" and path.endswith(slot))
        outcome: list[BaseException | int] = []
        t = threading.Thread(target=lambda: outcome.append(_append_or_error(log, row(1))))
        t.start()
        assert hold.reached.wait(30), "the writer reads the slot back after the resend's 412"
        moto_server.client().delete_object(Bucket=bucket, Key=slot)
        hold.release.set()
        t.join(30)
        assert len(outcome) == 1 and isinstance(outcome[0], WalTakenOverInFlight), outcome
        assert isinstance(outcome[0], OutcomeUnknown) and not isinstance(outcome[0], NothingWritten)
        with pytest.raises(WalFenced):
            log.append([row(2)])
    finally:
        log.close()


def _append_or_error(log: S3Log, r: rec.Record) -> BaseException | int:
    try:
        return log.append([r])
    except BaseException as exc:  # noqa: BLE001 - the test asserts on it
        return exc


def test_a_writer_stalled_past_a_takeover_and_a_trim_still_meets_the_claim(serializing_proxy, spec_at,
                                                                           s3_bucket, moto_server):
    """SlateDB issue 352 on the log: the old writer's next PUT aims at the slot the new writer
    claimed; the new writer trims everything the old one wrote, but never its claim, so the
    late PUT still fails instead of landing below the start as an acknowledged, lost append."""
    from support.wal_backends import owned

    spec = spec_at(serializing_proxy.endpoint)
    old = S3Log.open(spec, create=True, segment_bytes=4096)
    for i in range(5):
        old.append([row(i)])
    new = owned(S3Log.open(spec, segment_bytes=4096))
    try:
        for i in range(5, 60):
            new.append([row(i)])
        new.finish_segment()
        new.trim(new.end_lsn)
        _, bucket = s3_bucket
        keys = [o["Key"] for o in moto_server.client().list_objects_v2(Bucket=bucket, Prefix="log/0/")["Contents"]]
        slots = sorted(fmt.parse_name(k[len("log/"):], 0) for k in keys)
        assert 6 in slots and not {1, 2, 3, 4, 5} & set(slots), "the claim stays, the old writer's objects are gone"
        with pytest.raises(WalFenced):
            old.append([row(99)])
        assert bytes(row(99).body) not in bodies(new)
        again = S3Log.open(spec)
        try:
            assert bytes(row(99).body) not in bodies(again) and again.start_lsn == new.start_lsn
        finally:
            again.close()
    finally:
        old.close()
        new.close()


def test_a_put_that_landed_but_could_not_be_read_back_is_outcome_unknown(faulty_proxy, spec_at):
    """The PUT lands, its answer is lost, and S3 answers no read meanwhile: whether the append
    is in the log is unknown, and it is (after a reopen). It used to be a plain WalError ("not
    acknowledged"), on which a caller that appended again wrote it twice."""
    from sediment.errors import NothingWritten, OutcomeUnknown, WalOutcomeUnknown

    spec = spec_at(faulty_proxy.endpoint)
    log = S3Log.open(spec, create=True, max_attempts=1, read_timeout=5.0, outcome_deadline=1.0)
    log.append([row(0)])
    faulty_proxy.drop_response_next(1, match=is_log_put)
    faulty_proxy.fail_next(500, status=503, match=lambda m, p: m == "GET")
    with pytest.raises(WalOutcomeUnknown, match="may have landed") as got:
        log.append([row(1)])
    assert isinstance(got.value, OutcomeUnknown) and not isinstance(got.value, NothingWritten)
    faulty_proxy.clear()
    log.close()
    again = S3Log.open(spec)
    try:
        assert bodies(again).count(bytes(row(1).body)) == 1
    finally:
        again.close()


@pytest.mark.parametrize("kind", ["fail", "reset"])
def test_an_append_during_an_s3_outage_shorter_than_the_outcome_deadline_is_acknowledged_once(
        faulty_proxy, spec_at, kind):
    """Every request fails for about a second (5xx, or connections reset: a PUT may land with
    its answer lost): the writer keeps resolving its PUT and the append is acknowledged once S3
    answers, in the log exactly once. It used to end in WalOutcomeUnknown at the first failed
    read-back, and the engine had to be reopened."""
    import time

    spec = spec_at(faulty_proxy.endpoint)
    log = S3Log.open(spec, create=True, max_attempts=1, read_timeout=5.0)
    try:
        acked = [row(0)]
        log.append(acked)
        faulty_proxy.window(kind, 1.0)
        began = time.monotonic()
        r = row(1)
        log.append([r])
        acked.append(r)
        assert faulty_proxy.log.faults, "the outage met the append"
        assert time.monotonic() - began < 20.0
        assert_once_each(log, acked)
    finally:
        faulty_proxy.clear()
        log.close()
    again = S3Log.open(spec)
    try:
        assert_once_each(again, acked)
        assert len(bodies(again)) == len(acked)
    finally:
        again.close()


def test_an_outage_past_the_outcome_deadline_ends_in_outcome_unknown(faulty_proxy, spec_at):
    import time

    from sediment.errors import WalOutcomeUnknown

    log = S3Log.open(spec_at(faulty_proxy.endpoint), create=True, max_attempts=1, read_timeout=5.0,
                     outcome_deadline=1.0)
    try:
        faulty_proxy.window("fail", 60.0)
        began = time.monotonic()
        with pytest.raises(WalOutcomeUnknown, match="may have landed"):
            log.append([row(0)])
        assert time.monotonic() - began < 10.0  # the deadline is 1 s; slack for a loaded machine
    finally:
        faulty_proxy.clear()
        log.close()


def test_close_while_s3_does_not_answer_is_bounded_and_reports_outcome_unknown(faulty_proxy, spec_at):
    """S3 stops answering the log's PUTs (the proxy holds them): botocore alone would keep a
    close waiting for minutes (attempts x read timeout, then read-backs). close(timeout=1)
    returns within its bound with WalOutcomeUnknown naming the appends in flight; each of
    their waiters gets the same typed error at once; what was acknowledged before is there
    after a reopen, and the appends given up on are there entirely or not at all."""
    import time

    from sediment.errors import OutcomeUnknown, WalOutcomeUnknown

    log = S3Log.open(spec_at(faulty_proxy.endpoint), create=True, max_attempts=3, read_timeout=20.0)
    acked = [row(0)]
    log.append(acked)
    hold = faulty_proxy.hold_next(50, match=is_log_put)
    tickets = [log.submit([row(i)]) for i in range(1, 4)]
    assert hold.reached.wait(30), "a PUT reached the proxy and is held"
    began = time.monotonic()
    with pytest.raises(WalOutcomeUnknown, match=r"append\(s\).*unknown"):
        log.close(timeout=1.0)
    assert time.monotonic() - began < 10.0  # the bound is 1 s; the rest is slack for a loaded machine
    for ticket in tickets:
        assert ticket.settled()
        with pytest.raises(OutcomeUnknown):
            ticket.wait()
    faulty_proxy.clear()
    hold.release.set()  # S3 answers again: the held PUT may land now, after close gave up on it
    again = S3Log.open(spec_at(faulty_proxy.endpoint))
    try:
        seen = bodies(again)
        assert seen[:1] == [bytes(acked[0].body)]
        given_up = [bytes(row(i).body) for i in range(1, 4)]
        assert seen[1:] in ([], given_up[:len(seen) - 1]), seen
    finally:
        again.close()


def test_an_append_whose_callback_fails_after_close_gave_up_is_still_answered(s3_bucket, spec_at):
    """The group's object landed and its callback is running when close() gives up on the
    writer (close's bound); the callback then raises. Close told only the appends S3 had not
    answered, so this one's waiter must learn the failure from the writer: it waited for ever
    (the failure path returned early once close had given up)."""
    from sediment.errors import WalError

    endpoint, _ = s3_bucket
    log = S3Log.open(spec_at(endpoint), create=True)
    entered, release = threading.Event(), threading.Event()

    def on_durable(records) -> None:
        entered.set()
        release.wait(30)
        raise RuntimeError("the callback failed")

    ticket = log.submit([row(1)], on_durable)
    outcome: list = []
    waiter = threading.Thread(target=lambda: outcome.append(_append_or_error_of(ticket)), daemon=True)
    waiter.start()
    assert entered.wait(30), "the object landed and the callback runs"
    log.close(timeout=0.2)  # the writer is busy in the callback: close gives up on it
    release.set()
    waiter.join(30)
    assert not waiter.is_alive(), "the append's waiter was never answered"
    assert isinstance(outcome[0], WalError) and "not acknowledged" in str(outcome[0]), outcome


def _append_or_error_of(ticket) -> BaseException | int:
    try:
        return ticket.wait()
    except BaseException as exc:  # noqa: BLE001 - the outcome is what the test looks at
        return exc


def test_an_append_that_landed_stays_acknowledged_when_the_segment_boundary_after_it_meets_a_claim(
        serializing_proxy, spec_at):
    """The group's object lands (its waiters are told so), then the segment's end object the
    writer writes right after it meets a new writer's claim. The append is in the log: its
    ticket must not turn into WalFenced ("nothing written") afterwards, which a cluster member
    answers as a redirect and a client resends at the new owner, doubling it."""
    spec = spec_at(serializing_proxy.endpoint)
    old = S3Log.open(spec, create=True, segment_bytes=4096)
    try:
        old.append([row(0)])
        boundary = fmt.slot_name(0, old._next_slot + 1)  # the group takes the next slot, its end the one after
        hold = serializing_proxy.hold_next(1, match=lambda m, p: m == "PUT" and p.split("?")[0].endswith(boundary))
        big = rec.Record(K.UPDATES, relation_id=1, t_lo=1, t_hi=1, count=1, body=b"x" * 5000)
        ticket = old.submit([big])
        assert hold.reached.wait(30), "the segment's end object is on its way once the group landed"
        assert ticket.settled()
        new = S3Log.open(spec)  # claims the slot the segment's end is aimed at
        try:
            hold.release.set()
            with pytest.raises(WalFenced):  # the writer is fenced for what comes next
                old.finish_segment()
            assert ticket.wait() == big.lsn  # what landed stays acknowledged
            assert bodies(new).count(bytes(big.body)) == 1
        finally:
            new.close()
    finally:
        old.close()
