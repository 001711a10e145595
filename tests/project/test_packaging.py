"""The distribution: a wheel named sediment-engine (``sediment`` on PyPI is another project)
that holds every package under the one import name ``sediment``, the ``sediment`` command,
the PySpark auto-registration module and the PEP 561 ``py.typed`` marker; installed, it
imports from where it was installed, not from the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent.parent
with open(ROOT / "pyproject.toml", "rb") as _f:
    _FOLDERS = tomllib.load(_f)["tool"]["setuptools"]["package-dir"].values()
SOURCES = ("pyproject.toml", "README.md", *sorted({folder.split("/")[0] for folder in _FOLDERS}))


def _build_wheel(tmp_path: Path) -> Path:
    """``pip wheel`` of a copy of the checkout: a build in place would leave build/ and
    egg-info in the work tree that other tests read."""
    src = tmp_path / "src"
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy(ROOT / name, src / name)
    out = tmp_path / "wheels"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    (wheel,) = out.glob("*.whl")
    return wheel


def _packages_in_checkout() -> set[str]:
    """Every package the checkout holds, by import name, through pyproject's package-dir."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {(ROOT / folder).resolve(): name for name, folder in config["package-dir"].items()}
    found = set()
    for name, folder in config["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            owner = next(folders[d] for d in (init.parent, *init.parent.parents) if d in folders)
            rel = init.parent.relative_to(ROOT / folder)
            if owner == name and not any(p.startswith((".", "__pycache__")) for p in rel.parts):
                found.add(".".join((name, *rel.parts)))
    return found


def test_the_wheel_holds_every_package_the_marker_and_the_command(tmp_path):
    wheel = _build_wheel(tmp_path)
    assert wheel.name.startswith("sediment_engine-0.1.0-")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        metadata = z.read(f"{dist_info}/METADATA").decode()
        entry_points = z.read(f"{dist_info}/entry_points.txt").decode()
    assert "Name: sediment-engine\n" in metadata
    assert "sediment = sediment.cli:main" in entry_points
    assert "sediment/py.typed" in names
    packages = {os.path.dirname(n).replace("/", ".") for n in names if n.endswith("/__init__.py")}
    expected = _packages_in_checkout()
    assert "sediment.wal.replication.node" in expected and "pyspark_sediment" in expected
    assert expected <= packages, f"missing from the wheel: {sorted(expected - packages)}"
    tops = {n.split("/")[0] for n in names if not n.startswith(dist_info)}
    assert tops == {"sediment", "pyspark_sediment"}  # no bare trace/ or wal/ to shadow anything

    target = tmp_path / "installed"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                           str(wheel)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    probe = ("import sediment, sediment.engine.engine, sediment.trace.batch, sediment.cli.discover, trace\n"
             "print(sediment.__file__); print(sediment.trace.batch.__file__); print(trace.__file__)")
    env = {**os.environ, "PYTHONPATH": str(target)}
    ran = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert ran.returncode == 0, ran.stderr
    ours, batch, stdlib_trace = ran.stdout.split()
    assert ours.startswith(str(target)) and batch.startswith(str(target))
    assert not stdlib_trace.startswith(str(target))  # the standard library's trace is still found
    version = subprocess.run([str(target / "bin" / "sediment"), "--version"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120)
    assert version.returncode == 0 and version.stdout.strip() == "sediment 0.1.0"  # the command, installed
