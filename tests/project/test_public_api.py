"""The public API is pinned, and importing it is cheap (issue 14).

``sediment.__all__`` is the contract: a name added or dropped must show up here. Each
import check runs in a fresh interpreter, since this test process has loaded everything
already, and looks at ``sys.modules`` afterwards.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import sediment

PUBLIC = ["Engine", "Locks", "Transaction", "connect", "errors", "open", "parse_schema_spec"]
HEAVY = ["pyarrow", "trio", "boto3", "kazoo", "sediment.engine.engine", "sediment.server", "sediment.client"]


def loaded_after(code: str, watch: list[str]) -> list[str]:
    """Which of ``watch`` a fresh interpreter has in sys.modules after running ``code``."""
    probe = f"import json, sys\n{code}\nprint(json.dumps([m for m in {watch!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_public_exports_are_pinned():
    assert sorted(sediment.__all__) == PUBLIC
    assert set(PUBLIC) <= set(dir(sediment))


def test_every_public_name_resolves():
    for name in sediment.__all__:
        assert getattr(sediment, name) is not None, name
    assert sediment.Engine.__module__ == "sediment.engine.engine"
    assert sediment.Locks.__module__ == "sediment.engine.locks"
    assert sediment.Transaction.__module__ == "sediment.engine.transaction"
    assert sediment.errors.SedimentError.__module__ == "sediment.errors"
    with pytest.raises(AttributeError, match="no attribute 'Engin'"):
        sediment.Engin  # noqa: B018


def test_every_public_name_resolves_in_a_fresh_interpreter():
    code = ("import sediment\nfrom sediment import *\n"
            "assert all(getattr(sediment, n) is not None for n in sediment.__all__)")
    assert loaded_after(code, ["sediment.engine.engine"]) == ["sediment.engine.engine"]


@pytest.mark.parametrize("statement", ["import sediment", "import sediment.wal.replication.vote",
                                       "import sediment.errors", "import sediment.txn_state"])
def test_importing_is_cheap(statement):
    assert loaded_after(statement, HEAVY) == []


def test_the_client_imports_neither_the_server_nor_the_engine():
    loaded = loaded_after("import sediment.client", [*HEAVY, "sediment.engine.relation", "sediment.cli"])
    assert loaded == ["pyarrow", "sediment.client"]


def test_building_the_cli_parser_does_not_load_flight():
    loaded = loaded_after("from sediment.cli import build_parser\nbuild_parser()",
                          ["pyarrow.flight", "sediment.server", "sediment.client"])
    assert loaded == []


def test_a_local_engine_does_not_load_the_s3_client():
    """boto3 costs about a quarter of a second to import; an engine on local files and its
    CLI commands never use it, and an S3 store still loads it on first use."""
    code = ("import sediment, tempfile\n"
            "root = tempfile.mkdtemp()\n"
            "sediment.open(root + '/d').close()\n"
            "sediment.open(root + '/m', blob='memory://').close()\n"
            "from sediment.cli import main\n"
            "main(['verify', root + '/d'])")
    assert loaded_after(code, ["boto3", "botocore", "sediment.blob.s3"]) == []
    assert loaded_after("from sediment.blob import S3BlobStore", ["boto3", "sediment.blob.s3"]) == [
        "boto3", "sediment.blob.s3"]
