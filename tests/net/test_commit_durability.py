"""A commit is ``committed`` only once its COMMIT record is durable. When the log fails the
sync (a real EIO from fdatasync), the transaction is ``in doubt``: the engine says so, the
server's ``txn_state`` says so, and the client's retried commit or abort raises
OutcomeUnknown instead of claiming an outcome nobody knows."""

from __future__ import annotations

import errno
import os

import pyarrow as pa
import pytest

import sediment
from sediment import errors
from sediment.net.messages import Action
from sediment.server import SedimentFlightServer

SCHEMA = pa.schema([("id", pa.int64())])


def rows(ids: list[int], t: int) -> pa.Table:
    n = len(ids)
    return pa.table({"id": pa.array(ids, pa.int64()), "time": pa.array([t] * n, pa.int64()),
                     "diff": pa.array([1] * n, pa.int64())})


def fail_syncs(monkeypatch) -> None:
    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error (injected)")

    monkeypatch.setattr(os, "fdatasync", failing)


@pytest.mark.parametrize("how", ["commit", "commit_all"])
def test_a_commit_whose_sync_fails_is_in_doubt_not_committed(tmp_path, monkeypatch, how):
    engine = sediment.open(tmp_path / "d", segment_bytes=1 << 20)
    try:
        engine.add_relation("r", SCHEMA)
        txns = [engine.transaction(), engine.transaction()]
        for i, tx in enumerate(txns):
            tx.append("r", rows([i], 1))
        fail_syncs(monkeypatch)
        with pytest.raises(errors.WalError):
            if how == "commit":
                txns[0].commit()
            else:
                engine.commit_all(txns)
        checked = txns[:1] if how == "commit" else txns
        assert [tx.state for tx in checked] == ["in doubt"] * len(checked)
        with pytest.raises(errors.TransactionError, match="in doubt"):
            txns[0].commit()
        txns[0].abort()  # cannot undo a COMMIT record that may be durable
        assert txns[0].state == "in doubt"
    finally:
        monkeypatch.undo()
        try:
            engine.close()
        except errors.SedimentError:
            pass


def test_a_served_commit_whose_sync_fails_is_in_doubt_for_the_client(tmp_path, monkeypatch):
    engine = sediment.open(tmp_path / "d", segment_bytes=1 << 20)
    server = SedimentFlightServer(engine, "grpc://127.0.0.1:0", "token")
    client = sediment.connect(server.uri, token="token")
    try:
        client.add_relation("r", SCHEMA)
        tx = client.transaction()
        tx.append("r", rows([1], 1))
        fail_syncs(monkeypatch)
        with pytest.raises(errors.SedimentError) as first:
            tx.commit()
        assert not isinstance(first.value, errors.NothingWritten | errors.TransactionError)
        assert client._action(Action.TXN_STATE, txn=tx.id) == "in doubt"
        with pytest.raises(errors.OutcomeUnknown):
            tx.commit()
        with pytest.raises(errors.OutcomeUnknown):
            tx.abort()
        assert tx.state == "open"  # neither committed nor aborted as far as anyone knows
    finally:
        monkeypatch.undo()
        client.close()
        server.stop(grace=10.0)
        try:
            engine.close()
        except errors.SedimentError:
            pass
