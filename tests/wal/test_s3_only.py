"""A deployment on S3 alone: ``sediment.open(dir, wal="s3://...", metadata="s3://...",
blob="s3://...")``. The data directory holds only caches (its lock and the marker naming the
metadata store); a second coordinator on a fresh directory takes over from S3, the first is
fenced, and nothing acknowledged is lost. Coordinators run as real processes, killed with
SIGKILL or paused with SIGSTOP; races go through the proxy that serializes conditional
requests, as S3 does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pyarrow as pa
import pytest
from support.takeover_fence import s3_options, ups

import sediment
from sediment.errors import (
    CoordinatorSuperseded,
    InvalidArgument,
    StorageRecordMismatch,
    WalCorruption,
    WalFenced,
    WalMissing,
)
from sediment.wal import s3_format as fmt

pytestmark = [pytest.mark.s3, pytest.mark.timeout(180)]
SCHEMA = pa.schema([("k", pa.int64())])

COORDINATOR = """
import json, sys, pyarrow as pa, sediment
from sediment.errors import SedimentError
eng = sediment.open(sys.argv[1], **json.loads(sys.argv[2]))
if "r" not in eng.relations():
    eng.add_relation("r", pa.schema([("k", pa.int64())]))
t = max(eng.sealed("r") + 1, 1)
try:
    while True:
        eng.append("r", pa.table({"k": [t], "time": [t], "diff": [1]}))
        eng.seal("r", t)
        print(t, flush=True)
        t += 1
except SedimentError as exc:
    print("refused", type(exc).__name__, exc, flush=True)
"""


def start(data_dir, options: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", COORDINATOR, str(data_dir), json.dumps(options)],
                            stdout=subprocess.PIPE, text=True)


def read_acks(proc: subprocess.Popen, until: int) -> int:
    acked = 0
    for line in proc.stdout:
        acked = int(line)
        if acked >= until:
            break
    return acked


def all_keys(eng) -> list[int]:
    """Every key at the sealed time, repeated by its diff (a doubled append shows twice)."""
    table = eng.snapshot("r", eng.sealed("r"))
    return sorted(k for k, d in zip(table.column("k").to_pylist(), table.column("diff").to_pylist(), strict=True)
                  for _ in range(d))


def test_an_s3_only_engine_keeps_only_caches_and_a_fresh_coordinator_takes_over(tmp_path, s3_bucket):
    endpoint, bucket = s3_bucket
    options = s3_options(endpoint, bucket)
    first = sediment.open(tmp_path / "first", **options)
    first.add_relation("r", SCHEMA)
    for t in range(1, 6):
        first.append("r", ups([t], t))
        first.seal("r", t)
    first.compact()
    assert sorted(os.listdir(tmp_path / "first")) == ["LOCK", "REPLICATED"], "no log, catalog or batches on disk"
    assert first.stats()["wal"]["kind"] == "s3"
    with sediment.open(tmp_path / "second", metadata=options["metadata"]) as second:  # the rest from S3
        with pytest.raises((WalFenced, CoordinatorSuperseded)):  # the first is fenced at its next write
            first.append("r", ups([99], 6))
        assert all_keys(second) == [1, 2, 3, 4, 5]
        second.append("r", ups([6], 6))
        second.seal("r", 6)
        assert all_keys(second) == [1, 2, 3, 4, 5, 6]
    first.close()


def test_wal_on_s3_needs_shared_metadata_and_blobs(tmp_path, s3_bucket):
    endpoint, bucket = s3_bucket
    with pytest.raises(InvalidArgument):
        sediment.open(tmp_path / "a", wal=f"s3://{bucket}/wal", s3_endpoint=endpoint)
    assert not os.path.exists(tmp_path / "a")
    with pytest.raises(InvalidArgument):
        sediment.open(tmp_path / "b", wal="s3://", metadata=f"s3://{bucket}/m?endpoint={endpoint}")
    with pytest.raises(StorageRecordMismatch) as local_blobs:
        sediment.open(tmp_path / "c", wal=f"s3://{bucket}/wal", metadata=f"s3://{bucket}/m?endpoint={endpoint}",
                      s3_endpoint=endpoint)
    assert "an engine with its log on S3 needs a blob store every coordinator can reach" in str(local_blobs.value)


def test_the_cli_creates_serves_and_verifies_an_s3_only_engine(tmp_path, s3_bucket, capsys):
    from sediment.cli import main

    endpoint, bucket = s3_bucket
    o = s3_options(endpoint, bucket)
    flags = ["--wal", o["wal"], "--metadata", o["metadata"], "--blob", o["blob"], "--s3-endpoint", endpoint]
    d = str(tmp_path / "d")
    assert main(["--data-dir", d, *flags, "relation", "add", "r", "--schema", "k:int64"]) == 0
    with sediment.open(d) as eng:  # the marker names the metadata; the metadata names the rest
        eng.append("r", ups([1, 2], 1))
        eng.seal("r", 1)
    capsys.readouterr()
    assert main(["--data-dir", str(tmp_path / "fresh"), "--metadata", o["metadata"], "read", "r",
                 "--as-of", "1"]) == 0
    assert capsys.readouterr().out.splitlines() == ['"k","diff"', "1,1", "2,1"]
    assert main(["--data-dir", d, "verify", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "ok: no problems" in out and o["wal"] in out
    assert f"  s3://{bucket}/meta/engine/storage\n" in out, out  # a key's path, not the spec's ?endpoint= before it
    assert "?endpoint=" not in out, out
    elsewhere = tmp_path / "elsewhere"  # another machine: the metadata alone names the deployment
    assert main(["--data-dir", str(elsewhere), "--metadata", o["metadata"], "verify", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "ok: no problems" in out and o["wal"] in out
    assert not elsewhere.exists()


def _objects(client, bucket: str) -> dict[int, bytes]:
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="wal/0/")["Contents"]]
    return {fmt.parse_name(k[len("wal/"):], 0): client.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys}


@pytest.mark.parametrize("damage", ["flip", "delete"])
def test_verify_and_open_report_the_same_typed_error_for_a_damaged_object(tmp_path, s3_bucket, moto_server,
                                                                          capsys, damage):
    from sediment.cli import main

    endpoint, bucket = s3_bucket
    options = s3_options(endpoint, bucket)
    with sediment.open(tmp_path / "d", **options) as eng:
        eng.add_relation("r", SCHEMA)
        for t in range(1, 8):
            eng.append("r", ups([t], t))
            eng.seal("r", t)
    client = moto_server.client()
    objects = _objects(client, bucket)
    slot = sorted(s for s, data in objects.items() if fmt.decode_header(data).records)[2]
    key = "wal/" + fmt.slot_name(0, slot)
    if damage == "flip":
        data = bytearray(objects[slot])
        data[-3] ^= 0xFF
        client.put_object(Bucket=bucket, Key=key, Body=bytes(data))
    else:
        client.delete_object(Bucket=bucket, Key=key)
    expected = WalCorruption if damage == "flip" else WalMissing
    capsys.readouterr()
    assert main(["--data-dir", str(tmp_path / "d"), "verify"]) == 1
    out = capsys.readouterr().out
    with pytest.raises(expected) as opened:
        sediment.open(tmp_path / "other", metadata=options["metadata"])
    assert type(opened.value) is expected
    assert f"problem: {expected.__name__}: {opened.value}" in out, out


def acked_then_killed(directory, options: dict, n: int) -> int:
    """A coordinator process appending on ``directory``, SIGKILLed mid-append once at least ``n``
    appends were acknowledged; how many were."""
    proc = start(directory, options)
    try:
        return read_acks(proc, n)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)


def test_sigkill_mid_append_then_a_fresh_coordinator_has_every_acknowledged_append(tmp_path, s3_bucket):
    endpoint, bucket = s3_bucket
    options = s3_options(endpoint, bucket)
    acked = acked_then_killed(tmp_path / "first", options, 40)
    with sediment.open(tmp_path / "second", metadata=options["metadata"]) as eng:
        keys = all_keys(eng)
        assert keys[:acked] == list(range(1, acked + 1)), "0 acknowledged appends lost"
        assert len(keys) == len(set(keys)) and keys == list(range(1, len(keys) + 1)), "0 duplicates, no gaps"
        eng.append("r", ups([len(keys) + 1], len(keys) + 1))


def test_a_paused_coordinator_resumed_after_a_takeover_is_refused_and_writes_nothing(tmp_path, s3_bucket,
                                                                                    serializing_proxy, moto_server):
    _, bucket = s3_bucket
    options = s3_options(serializing_proxy.endpoint, bucket)
    proc = start(tmp_path / "first", options)
    try:
        acked = read_acks(proc, 30)
        proc.send_signal(signal.SIGSTOP)
        with sediment.open(tmp_path / "second", metadata=options["metadata"]) as eng:
            taken = len(_objects(moto_server.client(), bucket))
            proc.send_signal(signal.SIGCONT)
            rest = proc.stdout.read().splitlines()
            proc.wait(timeout=60)
            refused = [line for line in rest if line.startswith("refused")]
            assert len(refused) == 1 and refused[0].split()[1] in ("WalFenced", "CoordinatorSuperseded", "EngineClosed"), rest
            acked = max([acked, *(int(line) for line in rest if not line.startswith("refused"))])
            keys = all_keys(eng)
            assert keys == list(range(1, len(keys) + 1)) and len(keys) >= acked, "0 lost, 0 duplicates"
            objects = _objects(moto_server.client(), bucket)
            assert len(objects) == taken, "the resumed coordinator wrote no object"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait(timeout=30)


def test_a_coordinator_whose_put_answers_are_lost_keeps_each_append_once(tmp_path, s3_bucket, faulty_proxy):
    """The proxy forwards a coordinator's log PUTs but drops some answers after they landed:
    botocore resends, gets 412 on its own bytes, and counts the append once."""
    _, bucket = s3_bucket
    options = s3_options(faulty_proxy.endpoint, bucket)
    proc = start(tmp_path / "first", options)
    try:
        read_acks(proc, 5)
        faulty_proxy.drop_response_next(6, match=lambda method, path: method == "PUT" and "/wal/0/" in path)
        acked = read_acks(proc, 30)
        assert faulty_proxy.pending() == 0, "every scripted drop happened while appending"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    with sediment.open(tmp_path / "second", metadata=options["metadata"]) as eng:
        keys = all_keys(eng)
        assert keys[:acked] == list(range(1, acked + 1)), "0 acknowledged appends lost"
        assert keys == list(range(1, len(keys) + 1)), "0 duplicates"


def test_an_idle_coordinator_learns_of_a_takeover_from_its_clock(tmp_path, s3_bucket):
    """Without a write, the first coordinator finds the newer claim at its next look (every
    2 s of its clock) and closes: it serves no stale reads after that."""
    from support.waiting import Progress

    from sediment.clock import ManualClock

    endpoint, bucket = s3_bucket
    options = s3_options(endpoint, bucket)
    clock = ManualClock()
    first = sediment.open(tmp_path / "first", clock=clock, **options)
    told = Progress()
    first.superseded_listeners.append(lambda err: told.changed())
    first.add_relation("r", SCHEMA)
    first.append("r", ups([1], 1))
    first.seal("r", 1)
    with sediment.open(tmp_path / "second", metadata=options["metadata"]) as second:
        second.append("r", ups([2], 2))
        second.seal("r", 2)
        clock.advance(1.0)
        assert first.superseded is None, "no look before its interval"
        clock.advance(1.5)
        told.wait_for(lambda: first.superseded is not None, 30, "the first coordinator to learn of the takeover")
        with pytest.raises(CoordinatorSuperseded):
            first.snapshot("r", 1)
        assert all_keys(second) == [1, 2]
    first.close()


def test_a_served_coordinator_on_s3_exits_3_after_a_takeover(tmp_path, s3_bucket):
    """`sediment serve` on an S3-only data directory; another coordinator takes over from a
    fresh directory; with no request reaching it, the served one finds the claim (its look
    every 2 s), closes and exits 3, and every append it acknowledged is served by the new one."""
    from sediment.errors import SedimentError

    endpoint, bucket = s3_bucket
    options = s3_options(endpoint, bucket)
    with sediment.open(tmp_path / "a", **options) as eng:
        eng.add_relation("r", SCHEMA)
    serve = subprocess.Popen([sys.executable, "-m", "sediment", "--data-dir", str(tmp_path / "a"), "serve",
                              "--listen", "127.0.0.1:0", "--token", "secret"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = serve.stdout.readline()
        assert line.startswith("serving"), (line, serve.stderr.read() if serve.poll() is not None else "")
        with sediment.connect(line.split(" on ")[-1].strip(), token="secret") as client:
            client.append("r", ups([1], 1))
            with sediment.open(tmp_path / "b", metadata=options["metadata"]) as newer:
                assert serve.wait(timeout=60) == 3
                assert "superseded" in serve.stderr.read()
                with pytest.raises(SedimentError):
                    client.append("r", ups([3], 3))
                newer.append("r", ups([2], 2))
                newer.seal("r", 2)
                assert all_keys(newer) == [1, 2]
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()


def test_a_log_on_s3_without_its_metadata_is_refused(tmp_path, s3_bucket):
    """Metadata lost (or pointed elsewhere) while the log on S3 holds records: the open refuses
    rather than start an empty catalog over acknowledged updates."""
    from sediment.errors import MetadataMissing

    endpoint, bucket = s3_bucket
    options = s3_options(endpoint, bucket)
    with sediment.open(tmp_path / "a", **options) as eng:
        eng.add_relation("r", SCHEMA)
        eng.append("r", ups([1], 1))
    with pytest.raises(MetadataMissing):
        sediment.open(tmp_path / "b", **{**options, "metadata": f"s3://{bucket}/elsewhere?endpoint={endpoint}",
                                         "blob": f"s3://{bucket}/other-blobs"})


def _bucket_keys(moto_server, bucket: str) -> list[str]:
    return [o["Key"] for o in moto_server.client().list_objects_v2(Bucket=bucket).get("Contents", [])]


def test_s3_endpoint_reaches_a_metadata_spec_that_names_no_endpoint(tmp_path, s3_bucket, moto_server):
    """The README's Python form: metadata='s3://bucket/meta' with s3_endpoint. The metadata is on
    that endpoint too (before, it went to AWS while the log and batches went to s3_endpoint), and
    the marker names it, so the data directory alone reopens the engine."""
    endpoint, bucket = s3_bucket
    options = {**s3_options(endpoint, bucket), "metadata": f"s3://{bucket}/meta"}
    with sediment.open(tmp_path / "a", **options) as eng:
        eng.add_relation("r", SCHEMA)
        eng.append("r", ups([1], 1))
        eng.seal("r", 1)
    assert any(k.startswith("meta/engine/storage/") for k in _bucket_keys(moto_server, bucket))
    with sediment.open(tmp_path / "a") as eng:
        assert all_keys(eng) == [1]
    with sediment.open(tmp_path / "b", metadata=f"s3://{bucket}/meta", s3_endpoint=endpoint) as eng:
        assert all_keys(eng) == [1]


@pytest.mark.parametrize("where", ["s3_endpoint", "metadata", "wal"])
def test_an_endpoint_without_its_scheme_is_refused_before_anything_is_created(tmp_path, s3_bucket, moto_server,
                                                                              where):
    """botocore refuses 'host:port' with a bare ValueError; the open says which option is wrong."""
    endpoint, bucket = s3_bucket
    bare = endpoint.removeprefix("http://")
    options = s3_options(endpoint, bucket)
    if where == "s3_endpoint":
        options["s3_endpoint"] = bare
    else:
        options[where] = f"s3://{bucket}/{where}?endpoint={bare}"
    with pytest.raises(InvalidArgument, match="is not an http:// or https:// URL") as refused:
        sediment.open(tmp_path / "d", **options)
    assert bare in str(refused.value)
    assert not os.path.exists(tmp_path / "d")
    assert _bucket_keys(moto_server, bucket) == []


def test_the_newest_object_cut_short_is_damage_not_a_torn_tail(tmp_path, s3_bucket, moto_server, capsys):
    """S3 stores an object whole before it answers the PUT, so a newest object shorter than its
    header says held acknowledged appends. Before, the open cut it as a torn tail and served
    without them (verify then said ok); now open and verify refuse it by name, writing nothing."""
    from sediment.cli import main

    endpoint, bucket = s3_bucket
    options = s3_options(endpoint, bucket)
    acked = acked_then_killed(tmp_path / "first", options, 5)
    client = moto_server.client()
    objects = _objects(client, bucket)
    newest = max(objects)
    assert fmt.decode_header(objects[newest]).records, "a coordinator killed mid-loop leaves a data object newest"
    key = "wal/" + fmt.slot_name(0, newest)
    client.put_object(Bucket=bucket, Key=key, Body=objects[newest][:-10])
    before = sorted(_bucket_keys(moto_server, bucket))
    with pytest.raises(WalCorruption, match="cut short") as refused:
        sediment.open(tmp_path / "second", metadata=options["metadata"])
    assert f"s3://{bucket}/{key}" in str(refused.value)
    assert sorted(_bucket_keys(moto_server, bucket)) == before, "the refused open claimed nothing"
    capsys.readouterr()
    assert main(["--data-dir", str(tmp_path / "first"), "verify"]) == 1
    assert f"problem: WalCorruption: {refused.value}" in capsys.readouterr().out
    client.delete_object(Bucket=bucket, Key=key)  # the way out the error names: give up its records
    with sediment.open(tmp_path / "third", metadata=options["metadata"]) as eng:
        keys = all_keys(eng)
        assert keys == list(range(1, len(keys) + 1)) and len(keys) >= acked - 1


RACER = """
import json, sys, sediment
from sediment.engine.storage import Storage
from sediment.errors import SedimentError
real, first = Storage.settle_record, []
def settle(self, given):  # both read "no storage record yet" before either goes on: the race, every run
    record = real(self, given)
    if not first:
        first.append(self.created)
        print("read", self.created, flush=True)
        sys.stdin.readline()
    return record
Storage.settle_record = settle
try:
    eng = sediment.open(sys.argv[1], **json.loads(sys.argv[2]))
except SedimentError as exc:
    print("refused", type(exc).__name__, exc, flush=True)
else:
    print("opened", "created" if eng.storage.created else "found", flush=True)
    eng.close()
"""


def test_two_coordinators_creating_the_same_deployment_at_once_end_with_it_open(tmp_path, s3_bucket):
    """Two real processes create the same fresh S3-only deployment, both having read that no
    storage record exists (held at a barrier, released together). The one whose record lands
    first has created it; the other opens what it created (before, it failed with the metadata
    store's MetadataConflict). The creator may be fenced by that open, as by any later open,
    with a typed refusal; a third coordinator then opens and uses the deployment."""
    endpoint, bucket = s3_bucket
    options = s3_options(endpoint, bucket)
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(tmp_path / name), json.dumps(options)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for name in ("a", "b")]
    try:
        assert [p.stdout.readline().split() for p in procs] == [["read", "True"]] * 2
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outcomes = [p.communicate(timeout=120)[0].strip() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    found = [o for o in outcomes if o == "opened found"]
    others = [o for o in outcomes if o != "opened found"]
    assert len(found) == 1, outcomes
    assert others[0] == "opened created" or others[0].split()[1] in ("CoordinatorSuperseded", "WalFenced"), outcomes
    with sediment.open(tmp_path / "c", metadata=options["metadata"]) as third:
        assert not third.storage.created
        third.add_relation("r", SCHEMA)
        third.append("r", ups([1], 1))
        third.seal("r", 1)
        assert all_keys(third) == [1]
