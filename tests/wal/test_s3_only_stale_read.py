"""A read at an S3-only coordinator that another one took over meanwhile, failing because the
new coordinator compacted away a batch it was reading: answered CoordinatorSuperseded (the
client goes to the new coordinator), not BatchCorruption, a false report of damage the
client does not retry while the data is whole at the new one. Found by bench/nemesis_s3.py
(seed 3103): a woken coordinator's snapshot. The cluster's member has the same rule
(tests/cluster/test_cluster_stale_read.py). Real coordinator process, moto behind the fault
proxy, which holds the old coordinator's GET of the batch until the new one deleted it."""

from __future__ import annotations

import signal

import boto3
import pyarrow as pa
import pytest
from support.faulty_proxy import FaultyProxy
from support.s3_only_procs import Coordinator, s3_env
from support.takeover_fence import in_thread, s3_options, ups
from support.waiting import poll_until

import sediment
from sediment.errors import CoordinatorSuperseded

pytestmark = [pytest.mark.s3, pytest.mark.timeout(180)]
TOKEN = "s3-only-stale-read"


def _batch_get(method: str, path: str) -> bool:
    return method == "GET" and "/blobs/trace/" in path and "?" not in path


def test_a_read_failing_after_a_takeover_answers_superseded_not_a_missing_batch(tmp_path, s3_bucket, moto_server):
    endpoint, bucket = s3_bucket
    with FaultyProxy(endpoint, serialize_conditional=True) as proxy:
        options = s3_options(proxy.endpoint, bucket)
        with sediment.open(tmp_path / "a", **options) as eng:
            eng.add_relation("r", pa.schema([("k", pa.int64())]))
            for t in (1, 2):  # compacted into batches the next coordinator's compaction replaces
                eng.append("r", ups([10 * t, 10 * t + 1], t))
                eng.seal("r", t)
                eng.compact("r")
        first = Coordinator(tmp_path / "a", options["metadata"], s3_env(TOKEN))
        try:
            held = proxy.hold_next(1, match=_batch_get)
            with sediment.connect(first.uri, token=TOKEN, timeout=90) as old:
                read = in_thread(lambda: old.snapshot("r", 2))
                assert held.reached.wait(60), "the snapshot did not fetch a batch"
                first.signal(signal.SIGSTOP)  # it does not hear of the takeover
                path = next(p for m, p, _kind in proxy.log.faults if m == "GET")
                key = path.split("?")[0].split(f"/{bucket}/", 1)[1]
                s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
                with sediment.open(tmp_path / "b", metadata=options["metadata"]) as newer:
                    newer.append("r", ups([30], 3))
                    newer.seal("r", 3)
                    newer.compact("r")  # merged with the batch being read, which is deleted
                    poll_until(lambda: s3.list_objects_v2(Bucket=bucket, Prefix=key).get("KeyCount", 0) == 0, 60,
                               f"the new coordinator to delete {key}")
                    first.signal(signal.SIGCONT)
                    held.release.set()
                    assert read["done"].wait(60)
                    assert isinstance(read.get("error"), CoordinatorSuperseded), read  # before: BatchCorruption
                    assert sorted(newer.snapshot("r", 2).column("k").to_pylist()) == [10, 11, 20, 21]
            assert first.wait(60) == 3
        finally:
            first.kill()
