"""The client's own argument checks: what it refuses before (or instead of) a call, in one
typed line, where it used to raise pyarrow's or Python's own errors."""

from __future__ import annotations

import pytest
from test_server import SCHEMA, TOKEN, Served, rows, ups

import sediment
from sediment import errors

BAD_ADDRESSES = ["grpc://127.0.0.1:99999", "grpc://127.0.0.1:0", "grpc://127.0.0.1:abc", "grpc://a b:1",
                 "grpc+tls://127.0.0.1:65536", "grpc://127.0.0.1", "grpc://", "grpc://127.0.0.1:8815/path",
                 "127.0.0.1:99999"]


@pytest.mark.parametrize("uri", BAD_ADDRESSES)
def test_an_address_with_a_scheme_is_checked_like_a_bare_one(uri):
    """A port out of range or a malformed address after ``grpc://`` was pyarrow's ArrowInvalid
    (or a wait for a host that cannot exist): now the InvalidArgument a bare HOST:PORT gets."""
    with pytest.raises(errors.InvalidArgument, match="sediment server's address") as err:
        sediment.connect(uri, token=TOKEN, timeout=2.0)
    assert "\n" not in str(err.value) and repr(uri) in str(err.value)


@pytest.fixture
def served(tmp_path):
    s = Served(str(tmp_path / "data"))
    yield s
    s.stop()


@pytest.mark.parametrize("scheme", ["grpc://", "grpc+tcp://", ""])
def test_good_addresses_still_connect(served, scheme):
    with sediment.connect(served.server.uri.replace("grpc://", scheme), token=TOKEN) as c:
        assert c.relations() == []


@pytest.mark.parametrize("bad", ["txn", b"txn", {"a": 1}, 5, None, [1.5], [True], ["1"]])
def test_commit_all_refuses_what_is_not_a_list_of_transactions(served, bad):
    """``commit_all("txn")`` raised ValueError (int('t')), ``commit_all(5)`` TypeError; the
    engine refuses both with InvalidArgument, and so does the client now, leaving the open
    transaction usable."""
    c = served.client()
    c.add_relation("r", SCHEMA)
    tx = c.transaction()
    tx.append("r", ups([(1, "a", 1, 1)]))
    with pytest.raises(errors.InvalidArgument, match="commit_all") as err:
        c.commit_all(bad)
    assert "\n" not in str(err.value)
    assert served.server.open_transactions == [tx.id]
    c.commit_all([tx])
    c.seal("r", 1)
    assert rows(c.snapshot("r", 1)) == [(1, "a", 1)]


def test_a_lock_id_that_cannot_cross_the_network_is_invalid_argument(served):
    """A lock id JSON cannot carry was a plain ValueError from the client's encoder."""
    c = served.client()
    c.add_relation("r", SCHEMA)
    locks = sediment.Locks(high_water=0, write=[("r", object())])
    for call in (lambda: c.append("r", ups([(1, "a", 1, 1)]), locks=locks),
                 lambda: c.append_many({"r": ups([(1, "a", 1, 1)])}, locks=locks)):
        with pytest.raises(errors.InvalidArgument, match="lock ids"):
            call()
    c.seal("r", 1)
    assert c.snapshot("r", 1).num_rows == 0


def test_an_unreachable_cluster_is_one_typed_line_on_stderr_not_a_screen_of_warnings():
    """``connect("zk://...")`` with ZooKeeper down: kazoo's warning for each failed attempt went
    to stderr through Python's fallback handler (dozens of lines) before the typed error."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    uri = f"zk://127.0.0.1:{port}/nowhere"
    script = (f"import sediment\ntry:\n    sediment.connect({uri!r})\n"
              "except sediment.errors.MetadataUnavailable as e:\n    print('typed:', e)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout.startswith("typed: cannot reach ZooKeeper"), done.stdout + done.stderr
    assert done.stderr == "", done.stderr


def test_txn_state_takes_an_int_id(served):
    """A transaction id that is not an int is refused before any call (``int("x")`` was a bare
    ValueError); a real one is answered."""
    with served.client() as client:
        for bad in ("x", 1.5, True, None):
            with pytest.raises(errors.InvalidArgument, match="transaction id"):
                client.txn_state(bad)
        client.add_relation("r", SCHEMA)
        tx = client.transaction()
        tx.append("r", ups([(1, "a", 1, 1)]))
        assert client.txn_state(tx.id) == "open"
        tx.commit()
        assert client.txn_state(tx.id) == "committed"
