"""``sediment serve`` coordinators of one S3-only deployment, as real processes: each on its
own data directory, opened from the metadata spec alone (a takeover of whichever coordinator
served before), started on a port (0: a free one; a restart takes its old port back) and
stopped, killed or paused by its PID. Used by tests/wal/test_s3_only_keyed.py and by
bench/nemesis_s3.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from support.ports import ADDRESS_IN_USE, restart_on_port

SERVING_TIMEOUT = 120.0  # seconds an open (a takeover: claim, fence, replay) may take under load


def s3_env(token: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a coordinator: test credentials, no developer's AWS files."""
    env = {**(base if base is not None else os.environ), "SEDIMENT_TOKEN": token, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull,
           "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        env.pop(name, None)
    return env


class DidNotServe(AssertionError):
    """The coordinator exited before it served: its open failed (the reason is in its log's tail)."""


class PortInUse(Exception):
    """The coordinator found its port taken (a restart at the same address retries)."""


class Coordinator:
    """``sediment --data-dir DIR --metadata META serve --listen 127.0.0.1:PORT``; ready once it
    prints its ``serving`` line (its open, a takeover, is done). stderr goes to ``DIR.log``."""

    def __init__(self, data_dir: Path, metadata: str, env: dict[str, str], port: int = 0) -> None:
        self.data_dir = data_dir
        self.log = open(data_dir.parent / f"{data_dir.name}.log", "ab")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen([sys.executable, "-m", "sediment", "--data-dir", str(data_dir), "--metadata",
                                      metadata, "serve", "--listen", f"127.0.0.1:{port}", "--shutdown-grace", "5",
                                      "--log-level", "info"],
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        try:
            line = self.proc.stdout.readline()
            if not line.startswith("serving"):
                self.wait(SERVING_TIMEOUT)
                with open(self.log.name, errors="replace") as f:
                    tail = f.read()[-2000:]
                if ADDRESS_IN_USE in tail or "port in use" in tail:
                    raise PortInUse(tail)
                raise DidNotServe(f"coordinator on {data_dir} did not serve: {line!r}; {tail}")
        except BaseException:
            self.kill()
            raise
        self.uri = line.split()[-1]
        self.port = int(self.uri.rsplit(":", 1)[1])

    @classmethod
    def again(cls, data_dir: Path, metadata: str, env: dict[str, str], port: int) -> Coordinator:
        """A coordinator on ``port`` again (its address, which clients know), waiting for it to be free."""
        def attempt() -> Coordinator | None:
            try:
                return cls(data_dir, metadata, env, port)
            except PortInUse:
                return None

        return restart_on_port(port, attempt, f"sediment serve on {data_dir}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

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
