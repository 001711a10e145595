"""Run import-linter's contracts (``[tool.importlinter]`` in pyproject.toml) over sediment.

The source folders are mapped into the ``sediment`` package by ``package-dir``
(``engine/`` is ``sediment.engine``, ...), which import-linter cannot follow: it walks
the directory of the root package only. So this script first builds the package as
installed, as a tree of symlinks in a temporary directory, and runs ``lint-imports``
with that tree first on the path. Exit status: import-linter's (0 when every contract
is kept). Run from the repository root: ``python tools/lint_imports.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def package_dirs(root: str = ROOT) -> dict[str, str]:
    """``package-dir`` of pyproject.toml: dotted package name -> folder (absolute)."""
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        mapping = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return {name: os.path.join(root, folder) for name, folder in mapping.items()}


def build_tree(dest: str, root: str = ROOT) -> str:
    """Lay the package out under ``dest`` as it is installed; returns ``dest``."""
    dirs = package_dirs(root)
    top = [name for name in dirs if "." not in name]
    for name in top:
        os.makedirs(os.path.join(dest, name))
        for entry in os.listdir(dirs[name]):
            if entry != "__pycache__":
                os.symlink(os.path.join(dirs[name], entry), os.path.join(dest, name, entry))
    for name, folder in sorted(dirs.items()):
        if "." in name:
            link = os.path.join(dest, *name.split("."))
            if not os.path.lexists(link):
                os.symlink(folder, link)
    return dest


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="sediment-lint-imports-") as tmp:
        tree = build_tree(os.path.join(tmp, "tree"))
        env = dict(os.environ, PYTHONPATH=tree + os.pathsep + os.environ.get("PYTHONPATH", ""))
        cmd = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command as c; "
               "sys.exit(c())", "--config", os.path.join(ROOT, "pyproject.toml"), "--no-cache", *argv]
        return subprocess.run(cmd, cwd=tmp, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
