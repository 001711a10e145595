"""Keyed appends on an S3-only deployment served by ``sediment serve`` (one engine, no
cluster): a client whose answer was lost resends the append with its key (client id,
sequence number), to the same coordinator or to one that took the deployment over, and it is
applied once. Before, a server of one engine refused every key (InvalidArgument), so after a
lost answer or a takeover a client could only resend blindly (doubling) or give up. Real
coordinator processes against moto, a TCP proxy on 127.0.0.1 that loses the answer."""

from __future__ import annotations

import pyarrow as pa
import pytest
from support.cut_proxy import CutProxy
from support.s3_only_procs import Coordinator, s3_env
from support.takeover_fence import in_thread, s3_options, ups

import sediment
from sediment.errors import OutcomeUnknown

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
