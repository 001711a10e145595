"""`make replicated-demo` (tools/replicated_demo.py): ZooKeeper, moto and three storage nodes
on loopback, a coordinator killed and replaced, all through the CLI; it must succeed within
a bounded time and leave none of the processes it started running."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.zookeeper
DEMO = Path(__file__).resolve().parent.parent.parent / "tools" / "replicated_demo.py"


def test_the_replicated_demo_runs_and_stops_everything_it_started(tmp_path):
    done = subprocess.run([sys.executable, str(DEMO), "--workdir", str(tmp_path / "demo")],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "# replicated demo: ok" in out
    assert "kill -KILL" in out and '4,"fig",1' in out and "ok: no problems" in out
    assert re.search(r"^\$ \S+sediment --data-dir \S+coordinator-b seal orders 3$", out, re.M), \
        "a later command on B's directory runs without --metadata"
    stopped = [int(pid) for pid in re.findall(r"^\$ kill (\d+)   # ", out, re.M)]
    assert len(stopped) == 5, out[-2000:]  # ZooKeeper, moto, three storage nodes
    for pid in stopped:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

