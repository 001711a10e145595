"""A replicated deployment on loopback, end to end, through the command line a user types.

    make replicated-demo            # or: .venv/bin/python tools/replicated_demo.py [--workdir DIR]

Starts ZooKeeper (Debian's package, run as ``ZooKeeperServerMain zoo.cfg``), moto's S3
server and three storage nodes, each a process on 127.0.0.1 with a free port; creates
an S3 bucket; then, printing every command it runs:

1. coordinator A (``sediment serve``) creates relation ``orders`` on the replicated log,
   with its batches in S3; rows are appended and sealed at times 1 and 2 through it;
2. coordinator A is killed with SIGKILL;
3. coordinator B, on another data directory, takes over with ``--metadata`` alone (the
   storage record in ZooKeeper says where the log and the batches are), appends and seals
   time 3, reads everything back and compacts (batches to S3); ``sediment verify``
   checks the metadata, the batches and every node's copy of the log;
4. a later command on B's directory needs no ``--metadata`` (its marker names the store).

Everything it started is stopped by process id at the end, also on failure. Exit 0 when
every step gave what it should. ``tests/project/test_replicated_demo.py`` runs it.
"""

from __future__ import annotations

import argparse
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ZOOKEEPER_CP = "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar"
READY_TIMEOUT = 30.0
BIN = Path(sys.executable).parent


class DemoFailed(Exception):
    """A step did not give what it should (the message says which)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ask(port: int, word: bytes) -> bytes:
    """Send a ZooKeeper four-letter word; b"" while it does not answer."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
            s.sendall(word)
            return s.recv(64)
    except OSError:
        return b""


def first_line(proc: subprocess.Popen, what: str, prefix: str) -> str:
    """The first line a started process prints, within READY_TIMEOUT (a silent process fails
    the demo instead of hanging it); it starts with ``prefix`` once the process is ready."""
    ready, _, _ = select.select([proc.stdout], [], [], READY_TIMEOUT)
    if not ready:
        raise DemoFailed(f"{what} printed nothing within {READY_TIMEOUT}s")
    line = proc.stdout.readline()
    if not line.startswith(prefix):
        raise DemoFailed(f"{what} did not start: {line!r}")
    return line


def wait_for(check, what: str, proc: subprocess.Popen) -> None:
    """Poll a readiness check of a process we started (a port that answers)."""
    deadline = time.monotonic() + READY_TIMEOUT
    while not check():
        if proc.poll() is not None:
            raise DemoFailed(f"{what} exited with {proc.returncode} while starting")
        if time.monotonic() > deadline:
            raise DemoFailed(f"{what} was not ready within {READY_TIMEOUT}s")
        time.sleep(0.1)


class Demo:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.env = {**os.environ, "AWS_ACCESS_KEY_ID": "demo", "AWS_SECRET_ACCESS_KEY": "demo",
                    "AWS_DEFAULT_REGION": "us-east-1", "SEDIMENT_TOKEN": uuid.uuid4().hex}
        self.key = str(uuid.uuid4())

    def spawn(self, name: str, argv: list[str], **kw) -> subprocess.Popen:
        print(f"$ {' '.join(argv)} &", flush=True)
        with open(self.workdir / f"{name}.log", "wb") as log:  # the child keeps its own descriptor
            proc = subprocess.Popen(argv, stdout=kw.pop("stdout", log), stderr=log, stdin=subprocess.DEVNULL,
                                    env=self.env, **kw)
        self.procs.append((name, proc))
        return proc

    def run(self, *args: str, expect: int = 0) -> str:
        argv = [str(BIN / "sediment"), *args]
        print(f"$ {' '.join(argv)}", flush=True)
        done = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=120)
        out = done.stdout + done.stderr
        print("  " + out.strip().replace("\n", "\n  "), flush=True)
        if done.returncode != expect:
            raise DemoFailed(f"`sediment {' '.join(args)}` exited {done.returncode}, not {expect}")
        return done.stdout

    def start_services(self) -> tuple[str, str, list[str]]:
        """ZooKeeper, moto and three storage nodes; returns (metadata spec, S3 endpoint, replicas)."""
        zk_port = free_port()
        (self.workdir / "zk").mkdir()
        cfg = self.workdir / "zoo.cfg"
        cfg.write_text(f"tickTime=2000\ndataDir={self.workdir / 'zk'}\nclientPortAddress=127.0.0.1\n"
                       f"clientPort={zk_port}\nadmin.enableServer=false\n4lw.commands.whitelist=ruok,srvr,envi\n")
        zk = self.spawn("zookeeper", ["java", "-Xmx256m", "-cp", ZOOKEEPER_CP,
                                      "org.apache.zookeeper.server.ZooKeeperServerMain", str(cfg)])
        s3_port = free_port()
        moto = self.spawn("moto", [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(s3_port)])
        replicas = []
        for i in range(3):
            node = self.spawn(f"node{i}", [str(BIN / "sediment"), "storage-node", "--dir",
                                           str(self.workdir / f"node{i}"), "--listen", "127.0.0.1:0",
                                           "--cluster-key", self.key], stdout=subprocess.PIPE, text=True)
            replicas.append(first_line(node, f"storage node {i}", "listening on ").split()[-1])
        wait_for(lambda: ask(zk_port, b"ruok") == b"imok", "ZooKeeper", zk)
        wait_for(lambda: ask(s3_port, b"GET / HTTP/1.0\r\n\r\n").startswith(b"HTTP"), "moto", moto)
        endpoint = f"http://127.0.0.1:{s3_port}"
        import boto3

        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="demo",
                     aws_secret_access_key="demo").create_bucket(Bucket="demo-batches")  # S3 needs a bucket
        print(f"# ZooKeeper on 127.0.0.1:{zk_port}, S3 (moto) on {endpoint} with bucket demo-batches, "
              f"storage nodes {', '.join(replicas)}", flush=True)
        return f"zk://127.0.0.1:{zk_port}/demo", endpoint, replicas

    def scenario(self) -> None:
        spec, endpoint, replicas = self.start_services()
        a, b = str(self.workdir / "coordinator-a"), str(self.workdir / "coordinator-b")
        create = ["--data-dir", a, "--metadata", spec, "--replicas", ",".join(replicas), "--cluster-key", self.key,
                  "--blob", "s3://demo-batches/orders", "--s3-endpoint", endpoint]
        self.run(*create, "relation", "add", "orders", "--schema", "id:int64,item:string")
        serve = self.spawn("coordinator-a", [str(BIN / "sediment"), "--data-dir", a, "serve", "--listen",
                                             "127.0.0.1:0"], stdout=subprocess.PIPE, text=True)
        uri = first_line(serve, "coordinator A", "serving").split(" on ")[-1].strip()
        for t, rows in ((1, "1,apple,1,1\n2,pear,1,1\n"), (2, "3,plum,2,1\n1,apple,2,-1\n")):
            csv = self.workdir / f"t{t}.csv"
            csv.write_text("id,item,time,diff\n" + rows)
            self.run("--connect", uri, "append", "orders", str(csv))
            self.run("--connect", uri, "seal", "orders", str(t))
        print(f"$ kill -KILL {serve.pid}   # coordinator A dies", flush=True)
        os.kill(serve.pid, signal.SIGKILL)
        serve.wait()
        csv = self.workdir / "t3.csv"
        csv.write_text("id,item,time,diff\n4,fig,3,1\n")
        self.run("--data-dir", b, "--metadata", spec, "append", "orders", str(csv))  # B takes over
        self.run("--data-dir", b, "seal", "orders", "3")  # B's marker names the metadata store
        out = self.run("--data-dir", b, "read", "orders", "--as-of", "3")
        got = sorted(out.strip().splitlines()[1:])
        if got != ['2,"pear",1', '3,"plum",1', '4,"fig",1']:
            raise DemoFailed(f"coordinator B read {got} as of 3")
        self.run("--data-dir", b, "compact")  # batches to S3, the log trimmed on the nodes
        out = self.run("--data-dir", b, "verify", "--verbose")
        if "s3://demo-batches/orders/" not in out:
            raise DemoFailed("verify checked no batch in S3")
        print("# replicated demo: ok", flush=True)

    def stop_all(self) -> None:
        """Stop every process this demo started, by its id: SIGTERM, then SIGKILL."""
        for name, proc in reversed(self.procs):
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait()
                print(f"$ kill {proc.pid}   # {name} stopped", flush=True)
            if proc.stdout is not None:
                proc.stdout.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", help="where to keep every process's files (default: a temporary "
                                          "directory, removed afterwards)")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="sediment-replicated-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    demo = Demo(workdir)
    ok = False
    try:
        demo.scenario()
        ok = True
    except DemoFailed as exc:
        print(f"replicated demo failed: {exc} (logs in {workdir})", file=sys.stderr)
    finally:
        demo.stop_all()
        if ok and not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
