"""The main job runs end to end and checks itself."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa

from sediment import demo


def test_demo_runs_small_and_reports_ok():
    out = subprocess.run([sys.executable, "-m", "sediment", "demo", "--rows", "5000"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "verdict: OK" in out.stdout and "Traceback" not in out.stderr


def test_demo_expected_consolidation_catches_a_wrong_read():
    stream = demo.generate(2000, 10)
    everything = pa.concat_tables(stream)
    want = demo.expected_at(everything, 10)
    assert want.num_rows and set(want.column("diff").to_pylist()) == {1}
    broken = want.slice(1)
    assert not broken.equals(want)
