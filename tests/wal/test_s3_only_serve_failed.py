"""A served S3-only coordinator whose engine failed (a write of unknown outcome) after another
coordinator took the deployment over: before, ``sediment serve`` opened the engine again in
its process, as it does after any failure, and that open took the deployment back, fencing
the coordinator that had replaced it. A coordinator woken from a pause did so whenever its
first write met an S3 fault (bench/nemesis_s3.py found it). Now serve first asks the log
whether a newer writer claimed it since the failed engine opened, and if so stops, exit 3.
Real coordinator processes against moto through the fault proxy."""

from __future__ import annotations

import signal

import pyarrow as pa
import pytest
from support.faulty_proxy import FaultyProxy
from support.s3_only_procs import Coordinator, s3_env
from support.takeover_fence import s3_options, ups

import sediment
from sediment.errors import SedimentError

pytestmark = [pytest.mark.s3, pytest.mark.timeout(240)]
TOKEN = "s3-only-failed"


def test_a_coordinator_failed_after_a_takeover_exits_3_rather_than_take_it_back(tmp_path, s3_bucket):
    endpoint, bucket = s3_bucket
    with FaultyProxy(endpoint, serialize_conditional=True) as proxy:
        options = s3_options(proxy.endpoint, bucket)
        with sediment.open(tmp_path / "a", **options) as eng:
            eng.add_relation("r", pa.schema([("k", pa.int64())]))
        env = s3_env(TOKEN)
        first = Coordinator(tmp_path / "a", options["metadata"], env)
        second = None
        try:
            with sediment.connect(first.uri, token=TOKEN) as old:
                old.append("r", ups([1], 1))
                first.signal(signal.SIGSTOP)  # it cannot look for the takeover
                second = Coordinator(tmp_path / "b", options["metadata"], env)
                proxy.window("fail", 600, status=500)  # S3 answers 500 to all: the woken one's PUT stays in doubt
                first.signal(signal.SIGCONT)
                with pytest.raises(SedimentError) as doubt:
                    old.append("r", ups([2], 2))
                assert "WalFenced" not in type(doubt.value).__name__
            proxy.clear()
            assert first.wait(60) == 3  # before: it opened the engine again, taking the deployment back
            with sediment.connect(second.uri, token=TOKEN) as db:
                db.append("r", ups([3], 3))
                db.seal("r", 3)
                assert sorted(db.snapshot("r", 3).column("k").to_pylist()) in ([1, 3], [1, 2, 3])
        finally:
            for c in (first, second):
                if c is not None:
                    c.kill()
