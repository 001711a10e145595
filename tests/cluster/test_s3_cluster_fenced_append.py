"""An append that meets its partition's S3 log claimed by the new owner, made deterministic
with real processes: a leaving (SIGTERMed) owner still takes appends to the partition it
hands over; the new owner's CLAIM PUT is held at a fault proxy in front of moto, then the
old owner's append PUT (aimed at the same slot) is held too, the claim released and landed,
and only then the append released: it finds the slot taken (WalFenced, nothing written).
The member answers that as a redirect (NotPartitionOwner: nothing written, retry at the
owner), not as an outcome unknown, and the cluster holds the row once after the resend."""

from __future__ import annotations

import re
import signal
import threading
from pathlib import Path

import boto3
import pytest
from support.cluster_procs import TOKEN, S3Cluster
from support.faulty_proxy import FaultyProxy
from support.waiting import poll_until
from test_cluster import SCHEMA, keys_of, rows

import sediment
from sediment.client import Client
from sediment.errors import NotPartitionOwner

pytestmark = [pytest.mark.slow, pytest.mark.s3, pytest.mark.timeout(180)]
LEASE = 4.0
HOLD_WAIT = 60.0  # seconds a held request may take to reach the proxy on a loaded host


def wal_put(cluster: S3Cluster, partition: int, first: int):  # noqa: ANN201 - a proxy predicate
    """A PUT of one of ``partition``'s log objects at slot ``first`` or later."""
    name = cluster.uri.split("/")[3].split("?")[0]
    pattern = re.compile(rf"^/[^/]+/{re.escape(name)}-wal/p{partition}/\d+/(\d+)$")

    def match(method: str, path: str) -> bool:
        got = pattern.match(path.split("?", 1)[0])
        return method == "PUT" and got is not None and int(got.group(1)) >= first

    return match


def test_an_append_that_meets_the_new_owners_claim_is_a_redirect(tmp_path, moto_server, s3_bucket):
    with FaultyProxy(moto_server.endpoint, serialize_conditional=True) as proxy:
        cluster = S3Cluster(tmp_path, proxy.endpoint, s3_bucket[1], partitions=2, lease_time=LEASE)
        try:
            members = [cluster.start_member() for _ in range(2)]
            cluster.wait_assigned(members, timeout=60)
            with sediment.connect(cluster.uri, token=TOKEN, timeout=30) as db:
                db.add_relation("r0", SCHEMA, partition=0)
                db.append("r0", rows([1]))
                leaving = cluster.owner_of(0)
                direct = Client(leaving.uri, TOKEN, timeout=120)
                direct.append("r0", rows([2]))
                leaving.signal(signal.SIGTERM)  # partition 0 goes to the other member, which claims its log
                # the leaving owner ends its log's segment and compacts first; only then is the partition
                # reassigned, so the next PUT of its log after that is the new owner's claim
                wait_logged(leaving, "compacted the WAL tails of 1 partition before")
                claim_slot = int(slot_objects(moto_server, s3_bucket[1], cluster, 0)[-1].rsplit("/", 1)[1]) + 1
                claim = proxy.hold_next(1, match=wal_put(cluster, 0, claim_slot))
                assert claim.reached.wait(HOLD_WAIT), "the new owner's claim never reached S3"
                append = proxy.hold_next(1, match=wal_put(cluster, 0, claim_slot))
                answers: list[object] = []

                def send() -> None:
                    try:
                        direct.append("r0", rows([3]))
                        answers.append("acknowledged")
                    except Exception as exc:  # noqa: BLE001 - the answer under test
                        answers.append(exc)

                sender = threading.Thread(target=send, daemon=True)
                sender.start()  # the leaving owner takes it: its new owner has not fenced it yet
                assert append.reached.wait(HOLD_WAIT), "the leaving owner's append never reached S3"
                claimed = slot_objects(moto_server, s3_bucket[1], cluster, 0)
                claim.release.set()
                poll_until(lambda: slot_objects(moto_server, s3_bucket[1], cluster, 0) != claimed, HOLD_WAIT,
                           "the new owner's claim to land")
                append.release.set()  # aimed at the slot the claim took
                sender.join(120)
                # a redirect (nothing written: the client may resend it anywhere), not MembershipLost
                assert len(answers) == 1 and isinstance(answers[0], NotPartitionOwner), answers
                direct.close()
                assert leaving.wait(90) == 0
                # db's append stream kept the leaving server draining (5 s grace) while its port refused
                # new connections, and the other member's probe counted it gone: it left all the same,
                # neither joining again under a new id nor taking a partition back on its way out
                log = Path(leaving.log.name).read_text().split("leaving: handing partitions over")[1]
                assert "joined " not in log and "opens partition" not in log, log
                db.append("r0", rows([3]))  # nothing was written: the resend is the only copy
                assert keys_of(db, "r0", 10) == [1, 2, 3]
        finally:
            cluster.close()


def wait_logged(member, text: str) -> None:  # noqa: ANN001
    poll_until(lambda: text in Path(member.log.name).read_text(), HOLD_WAIT, f"{member.member_id} to log {text!r}")


def slot_objects(moto_server, bucket: str, cluster: S3Cluster, partition: int) -> list[str]:  # noqa: ANN001
    """The log objects of ``partition``, read from moto directly (not through the proxy)."""
    name = cluster.uri.split("/")[3].split("?")[0]
    s3 = boto3.client("s3", endpoint_url=moto_server.endpoint)
    got = s3.list_objects_v2(Bucket=bucket, Prefix=f"{name}-wal/p{partition}/")
    return sorted(o["Key"] for o in got.get("Contents", []))
