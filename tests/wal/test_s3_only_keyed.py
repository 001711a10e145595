"""Keyed appends on an S3-only deployment served by ``sediment serve`` (one engine, no
cluster): a client whose answer was lost resends the append with its key (client id,
sequence number), to the same coordinator or to one that took the deployment over, and it is
applied once. Before, a server of one engine refused every key (InvalidArgument), so after a
lost answer or a takeover a client could only resend blindly (doubling) or give up. Real
coordinator processes against moto, a TCP proxy on 127.0.0.1 that loses the answer."""

from __future__ import annotations

import signal

import pyarrow as pa
import pytest
from support.cut_proxy import CutProxy
from support.faulty_proxy import FaultyProxy
from support.s3_only_procs import Coordinator, s3_env
from support.takeover_fence import in_thread, s3_options, ups
from support.waiting import poll_until

import sediment
from sediment.errors import OutcomeUnknown, SedimentError

pytestmark = [pytest.mark.s3, pytest.mark.timeout(180)]
TOKEN = "keyed-s3-only"


def counts(db, top: int) -> dict[int, int]:
    db.seal("r", top)
    snap = db.snapshot("r", top)
    return dict(zip(snap.column("k").to_pylist(), snap.column("diff").to_pylist(), strict=True))


def test_a_keyed_append_whose_answer_was_lost_is_applied_once_here_and_after_a_takeover(tmp_path, s3_bucket):
    endpoint, bucket = s3_bucket
    options = s3_options(endpoint, bucket)
    with sediment.open(tmp_path / "a", **options) as eng:
        eng.add_relation("r", pa.schema([("k", pa.int64())]))
    env = s3_env(TOKEN)
    first = Coordinator(tmp_path / "a", options["metadata"], env)
    second = None
    proxy = CutProxy()
    try:
        proxy.upstream = first.uri
        with sediment.connect(proxy.uri, token=TOKEN, timeout=60) as lossy:
            proxy.arm(b"client-1")  # the append goes out; its answer never comes back
            call = in_thread(lambda: lossy.append_once("r", ups([1], 1), "client-1", 1))
            assert proxy.triggered.wait(30)
            proxy.cut()
            assert call["done"].wait(30)
            assert isinstance(call.get("error"), OutcomeUnknown), call
        with sediment.connect(first.uri, token=TOKEN) as db:
            db.append_once("r", ups([1], 1), "client-1", 1)  # the resend: applied at most once
            db.append_once("r", ups([2], 2), "client-1", 2)
        first.kill()
        second = Coordinator(tmp_path / "b", options["metadata"], env)  # the takeover
        with sediment.connect(second.uri, token=TOKEN) as db:
            db.append_once("r", ups([2], 2), "client-1", 2)  # a resend after the takeover: applied already
            db.append_once("r", ups([1], 1), "client-1", 1)  # an older key of the same client
            db.append_once("r", ups([3], 3), "client-1", 3)
            db.append_once("r", ups([4], 3), "client-2", 1)
            assert counts(db, 3) == {1: 1, 2: 1, 3: 1, 4: 1}
            assert db.relations() == ["r"]
    finally:
        proxy.close()
        for c in (first, second):
            if c is not None:
                c.kill()


def _wal_list(method: str, path: str) -> bool:
    return method == "GET" and "list-type=2" in path and "prefix=wal" in path


def _epoch_confirmation(method: str, path: str) -> bool:
    """The first step of a creation's confirmation: a LIST of the epoch key's versions."""
    return method == "GET" and "list-type=2" in path and "prefix=meta%2Fengine%2Fepoch" in path


def test_a_keyed_append_waits_out_a_replaced_coordinators_creation_of_the_key_table(tmp_path, s3_bucket):
    """The first keyed append makes the key table (relation ``_cluster.applied``). A replaced
    coordinator, woken from a pause before it heard of the takeover, writes that relation's
    catalog entry and is held before its confirmation, which will remove it again; meanwhile
    the new coordinator's first keyed append finds the entry. Before, it took the entry for
    its own table, cached an empty one over a relation its engine does not have, and failed
    with UnknownRelation (and every keyed append after it, until a reopen)."""
    endpoint, bucket = s3_bucket
    with FaultyProxy(endpoint, serialize_conditional=True) as proxy:
        options = s3_options(proxy.endpoint, bucket)
        with sediment.open(tmp_path / "a", **options) as eng:
            eng.add_relation("r", pa.schema([("k", pa.int64())]))
        env = s3_env(TOKEN)
        first = Coordinator(tmp_path / "a", options["metadata"], env)
        second = None
        try:
            with sediment.connect(first.uri, token=TOKEN, timeout=90) as old:
                old.append("r", ups([0], 1))
                first.signal(signal.SIGSTOP)
                second = Coordinator(tmp_path / "b", options["metadata"], env)
                lists = proxy.hold_next(1000, match=_wal_list)  # the woken one does not hear of the takeover
                confirmation = proxy.hold_next(1, match=_epoch_confirmation)
                woken = in_thread(lambda: old.append_once("r", ups([1], 1), "client-a", 1))
                first.signal(signal.SIGCONT)
                assert confirmation.reached.wait(60), ("the woken coordinator did not create the key table", woken)
                mark = len(proxy.log.requests)
                with sediment.connect(second.uri, token=TOKEN, timeout=90) as db:
                    call = in_thread(lambda: db.append_once("r", ups([2], 2), "client-b", 1))

                    def looks() -> int:
                        return sum("list-type=2" in p and "_cluster.applied" in p for _m, p in proxy.log.requests[mark:])

                    # it found the entry, and looks again
                    poll_until(lambda: looks() >= 2 or call["done"].is_set(), 60,
                               "the new coordinator to look for the key table again")
                    assert not call["done"].is_set(), call  # before: UnknownRelation at once
                    confirmation.release.set()  # the woken one's confirmation fails: it removes the entry
                    assert call["done"].wait(60) and "error" not in call, call
                    assert woken["done"].wait(60) and isinstance(woken.get("error"), SedimentError), woken
                    lists.release.set()
                    db.append_once("r", ups([2], 2), "client-b", 1)  # a resend: applied once
                    db.append_once("r", ups([3], 3), "client-b", 2)
                    assert counts(db, 3) == {0: 1, 2: 1, 3: 1}
            assert first.wait(60) == 3
        finally:
            for c in (first, second):
                if c is not None:
                    c.kill()
