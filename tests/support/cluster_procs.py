"""A cluster of coordinators for tests: a real ZooKeeper, moto's S3, three storage nodes and
``sediment serve --cluster`` member processes, each started on a free port and stopped (or
killed, paused) by its PID."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from support.replication import KEY, Node, start_all, stop_all

TOKEN = "cluster-test-token"
KILL_AT = str(Path(__file__).with_name("member_kill_at.py"))
HOLD_AT = str(Path(__file__).with_name("member_hold_at.py"))


class MemberProc:
    """One ``sediment serve --cluster`` process; ready once it prints its ``serving`` line.
    ``hold_at``: steps a test can hold (tests/support/member_hold_at.py), by files in ``holds``;
    ``python``: the interpreter, whose install of sediment runs (a benchmark's other build)."""

    def __init__(self, cluster: str, data_dir: Path, env: dict[str, str], advertise: str | None = None,
                 kill_at: tuple[str, ...] = (), hold_at: tuple[str, ...] = (), python: str = sys.executable) -> None:
        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        self.log = open(data_dir.parent / f"{data_dir.name}.log", "ab")  # noqa: SIM115 - closed in wait()
        extra = ["--advertise", advertise] if advertise is not None else []
        self.holds = data_dir.parent / f"{data_dir.name}-holds"
        command = [python, "-m", "sediment"] if not kill_at else [python, KILL_AT, *kill_at, "--"]
        if hold_at:
            self.holds.mkdir()
            command = [python, HOLD_AT, str(self.holds), *hold_at, "--"]
        self.proc = subprocess.Popen([*command, "serve", "--cluster", cluster,
                                      "--data-dir", str(data_dir), "--listen", "127.0.0.1:0", "--log-level", "info",
                                      "--shutdown-grace", "5", "--metrics-listen", "127.0.0.1:0", *extra],
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        try:
            line = self.proc.stdout.readline()
            self.metrics_url = line.split()[-1] if line.startswith("metrics on ") else None
            if self.metrics_url is not None:
                line = self.proc.stdout.readline()
            assert line.startswith("serving cluster"), f"member did not start: {line!r}; see {self.log.name}"
        except BaseException:
            self.kill()  # a member that did not come up is not left running
            raise
        words = line.split()
        self.member_id, self.uri = words[words.index("as") + 1], words[-1]

    def metric(self, name: str) -> float:
        """The value of one unlabelled sample on the member's /metrics page."""
        import urllib.request

        with urllib.request.urlopen(self.metrics_url, timeout=10) as page:
            for line in page.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        raise AssertionError(f"{name} not on {self.metrics_url}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def wait(self, timeout: float = 60) -> int:
        code = self.proc.wait(timeout=timeout)
        self.proc.stdout.close()
        self.log.close()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL)
        self.wait()


class Cluster:
    """ZooKeeper path, nodes and members of one test cluster."""

    def __init__(self, root: Path, zk_hosts: str, zk_root: str, moto_endpoint: str, bucket: str, *,
                 partitions: int = 4, session_timeout: float = 3.0, node_args: tuple[str, ...] = (),
                 python: str = sys.executable) -> None:
        self.root = root
        self.python = python  # the members' interpreter
        self.uri = f"zk://{zk_hosts}{zk_root}"
        self.session_timeout = session_timeout
        self.env = {**os.environ, "SEDIMENT_TOKEN": TOKEN, "AWS_ENDPOINT_URL": moto_endpoint}
        self.nodes = [Node(root / f"node{i}", extra_args=node_args) for i in range(3)]
        self.members: list[MemberProc] = []
        start_all(self.nodes)
        try:
            subprocess.run([sys.executable, "-m", "sediment", "cluster", "create", "--metadata", self.uri,
                            "--partitions", str(partitions), "--replicas", ",".join(n.address for n in self.nodes),
                            "--cluster-key", str(KEY), "--blob", f"s3://{bucket}/{zk_root.strip('/')}",
                            "--s3-endpoint", moto_endpoint, "--session-timeout", str(session_timeout)],
                           check=True, env=self.env, capture_output=True)
        except BaseException:
            stop_all(self.nodes)  # the cluster was not made: its nodes are not left running
            raise

    def start_member(self, advertise: str | None = None, kill_at: tuple[str, ...] = (),
                     hold_at: tuple[str, ...] = ()) -> MemberProc:
        """A new member; ``advertise``: the address it names to clients (a proxy's) instead of its own;
        ``kill_at``: steps at which it SIGKILLs itself (tests/support/member_kill_at.py);
        ``hold_at``: steps a test can hold (tests/support/member_hold_at.py)."""
        m = MemberProc(self.uri, self.root / f"member-{uuid.uuid4().hex[:6]}", self.env, advertise, kill_at,
                       hold_at, self.python)
        self.members.append(m)
        return m

    def live(self) -> list[MemberProc]:
        return [m for m in self.members if m.proc.poll() is None]

    def view(self) -> dict:
        from sediment.cluster import layout

        where = layout.ClusterPath.parse(self.uri)
        zk = layout.connect_zk(where)
        try:
            return layout.read_view(zk, where)
        finally:
            zk.stop()
            zk.close()

    def wait_assigned(self, members: list[MemberProc], timeout: float = 30.0) -> dict:
        """Until every partition is assigned, only to ``members``, balanced; the view."""
        ids = {m.member_id for m in members}
        deadline = time.monotonic() + timeout
        while True:
            view = self.view()
            owners = [m for m, _g in view["assignment"].values()]
            counts = [owners.count(i) for i in ids]
            if owners and set(owners) <= ids and max(counts) - min(counts) <= 1:
                return view
            assert time.monotonic() < deadline, f"assignment not balanced over {sorted(ids)}: {view}"
            time.sleep(0.1)

    def owner_of(self, partition: int) -> MemberProc:
        member, _g = self.view()["assignment"][partition]
        return next(m for m in self.members if m.member_id == member)

    def close(self) -> None:
        for m in self.members:
            if m.proc.returncode is None:
                m.kill()
        stop_all(self.nodes)


@contextmanager
def running_cluster(root: Path, zookeeper, zk_root: str, moto_server, s3_bucket, **options) -> Iterator[Cluster]:
    """A :class:`Cluster` on the test fixtures' ZooKeeper and moto, closed (every process
    killed) at the end."""
    c = Cluster(root, f"127.0.0.1:{zookeeper.port}", zk_root, moto_server.endpoint, s3_bucket[1], **options)
    try:
        yield c
    finally:
        c.close()


class S3Cluster:
    """An S3-only cluster (``s3://BUCKET/PREFIX?endpoint=...``) on moto: no ZooKeeper, no storage
    nodes; members come and go as :class:`Cluster`'s do. ``lease_time`` is its session timeout."""

    def __init__(self, root: Path, moto_endpoint: str, bucket: str, *, partitions: int = 2,
                 lease_time: float = 3.0, python: str = sys.executable) -> None:
        self.root = root
        self.python = python  # the members' interpreter
        name = f"cluster-{uuid.uuid4().hex[:8]}"
        self.uri = f"s3://{bucket}/{name}?endpoint={moto_endpoint}"
        self.bucket, self.blob_prefix = bucket, f"{name}-blobs"  # partition n's batches under <blob_prefix>/p<n>/
        self.session_timeout = self.lease_time = lease_time
        self.env = {**os.environ, "SEDIMENT_TOKEN": TOKEN, "AWS_ENDPOINT_URL": moto_endpoint}
        self.members: list[MemberProc] = []
        subprocess.run([sys.executable, "-m", "sediment", "cluster", "create", "--metadata", self.uri,
                        "--partitions", str(partitions), "--blob", f"s3://{bucket}/{self.blob_prefix}",
                        "--wal", f"s3://{bucket}/{name}-wal", "--s3-endpoint", moto_endpoint,
                        "--session-timeout", str(lease_time)], check=True, env=self.env, capture_output=True)

    def start_member(self, hold_at: tuple[str, ...] = ()) -> MemberProc:
        m = MemberProc(self.uri, self.root / f"member-{uuid.uuid4().hex[:6]}", self.env, hold_at=hold_at,
                       python=self.python)
        self.members.append(m)
        return m

    def view(self) -> dict:
        from sediment.cluster.directory import Directory

        directory = Directory(self.uri)
        try:
            return directory.read_view()
        finally:
            directory.close()

    wait_assigned = Cluster.wait_assigned
    owner_of = Cluster.owner_of
    live = Cluster.live

    def close(self) -> None:
        for m in self.members:
            if m.proc.returncode is None:
                m.kill()
