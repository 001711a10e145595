"""A member's --data-dir is its own: a second member on it, or a directory that holds an
engine, is refused in one line before joining; a first start that fails leaves no directory."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.waiting import poll_until

import sediment

pytestmark = [pytest.mark.zookeeper, pytest.mark.s3, pytest.mark.timeout(120)]


def serve(cluster, data_dir, uri: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sediment", "serve", "--cluster", uri or cluster.uri, "--data-dir",
                           str(data_dir), "--listen", "127.0.0.1:0"], env=cluster.env, capture_output=True,
                          text=True, timeout=60)


def test_a_members_directory_is_its_own(cluster, tmp_path):
    member = cluster.start_member()
    view = cluster.wait_assigned([member])
    # a second member on the same directory joined, took partitions over, and failed each
    # open on the first one's locks once a second
    # until its first partition opens, a member's directory held only its lock: taken for a new
    # coordinator's with --metadata; its MEMBER record names the cluster instead
    record = json.loads((member.data_dir / "MEMBER").read_text())
    assert record == {"format": "sediment-member", "version": 1, "cluster": cluster.uri}
    shared = subprocess.run([sys.executable, "-m", "sediment", "--data-dir", str(member.data_dir), "--metadata",
                             cluster.uri + "/partitions/0", "stats"], env=cluster.env, capture_output=True, text=True,
                            timeout=60)
    assert shared.returncode == 1 and shared.stderr.count("\n") == 1, shared.stderr
    assert f"a member of {cluster.uri}" in shared.stderr and f"--connect {cluster.uri}" in shared.stderr
    second = serve(cluster, member.data_dir)
    assert second.returncode == 1 and second.stderr.count("\n") == 1, second.stderr
    assert f"{member.data_dir} is in use by another sediment process" in second.stderr
    assert "serving cluster" not in second.stdout and set(cluster.view()["members"]) == {member.member_id}
    assert cluster.view()["assignment"] == view["assignment"]
    # a command on the member's directory was told to make an engine there (`relation add`)
    poll_until(lambda: (member.data_dir / "partitions").is_dir(), 30, "the member's first partition")
    listed = subprocess.run([sys.executable, "-m", "sediment", "--data-dir", str(member.data_dir), "relation", "list"],
                            env=cluster.env, capture_output=True, text=True, timeout=60)
    assert listed.returncode == 1 and listed.stderr.count("\n") == 1 and "relation add" not in listed.stderr
    assert "is a cluster member's directory" in listed.stderr and "--connect zk://" in listed.stderr
    # a standalone engine's directory: the member made partitions/N engines inside it
    engine_dir = tmp_path / "engine"
    sediment.open(engine_dir).close()
    before = sorted(p.name for p in engine_dir.iterdir())
    refused = serve(cluster, engine_dir)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert f"--data-dir {engine_dir} holds an engine" in refused.stderr
    assert sorted(p.name for p in engine_dir.iterdir()) == before
    # a first start that fails (no such cluster) leaves no directory behind
    fresh = tmp_path / "new" / "member"
    missing = serve(cluster, fresh, uri=cluster.uri + "-none")
    assert missing.returncode == 1 and "no cluster at" in missing.stderr and not (tmp_path / "new").exists()
