"""Transaction groups on the server end with ``commit_all(group=...)`` or ``abort_group``: a
task attempt that outlives its Spark job (Spark does not wait for it when the job fails)
cannot begin a transaction in the ended group and leave it open (issue 24: a failed job's
straggler left one open transaction behind)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from support.served import served_engine

import sediment
from sediment.errors import InvalidArgument, TransactionError
from sediment.net.messages import Action
from sediment.server import SedimentFlightServer

SCHEMA = pa.schema([("id", pa.int64())])


def rows(ids: list[int], t: int) -> pa.Table:
    n = len(ids)
    return pa.table({"id": pa.array(ids, pa.int64()), "time": pa.array([t] * n, pa.int64()),
                     "diff": pa.array([1] * n, pa.int64())})


@pytest.mark.parametrize("end", ["abort_group", "commit_all"])
def test_an_ended_group_refuses_new_transactions_and_keeps_none_open(tmp_path, end):
    engine = sediment.open(tmp_path / "d", segment_bytes=1 << 20)
    server = SedimentFlightServer(engine, "grpc://127.0.0.1:0", "token")
    client = sediment.connect(server.uri, token="token")
    try:
        client.add_relation("r", SCHEMA)
        winner = client.transaction(group="job-1")
        winner.append("r", rows([1], 1))
        loser = client.transaction(group="job-1")
        loser.append("r", rows([2], 1))
        if end == "abort_group":
            assert client.abort_group("job-1") == 2
        else:
            client.commit_all([winner], group="job-1")
        with pytest.raises(TransactionError, match="'job-1' has ended"):
            client.transaction(group="job-1")  # the straggler: refused, nothing begun
        other = client.transaction(group="job-2")  # other groups, and no group, go on
        other.append("r", rows([3], 1))
        other.commit()
        client.seal("r", 1)
        got = sorted(client.snapshot("r", 1).column("id").to_pylist())
        assert got == ([3] if end == "abort_group" else [1, 3])
        assert server.open_transactions == []
    finally:
        client.close()
        server.stop(grace=10.0)
        engine.close()


@pytest.mark.parametrize(("action", "body"), [
    ("txn_state", {"txn": [1]}), ("commit", {"txn": [1]}), ("abort", {"txn": {"a": 1}}),
    ("commit_all", {"txns": ["ok", [1]]}), ("commit", {"txn": True}),
])
def test_a_transaction_id_that_is_not_an_integer_is_refused_before_anything_changes(tmp_path, action, body):
    with served_engine(tmp_path / "d", "token", SCHEMA) as (_engine, server, client):
        tx = client.transaction()
        tx.append("r", rows([1], 1))
        if action == "commit_all":
            body = {"txns": [tx.id, body["txns"][1]]}
        with pytest.raises(InvalidArgument, match="transaction id is an integer"):
            client._action(Action(action), **body)
        assert server.open_transactions == [tx.id]  # the good one of a commit_all was not aborted
        tx.commit()
        client.seal("r", 1)
        assert client.snapshot("r", 1).column("id").to_pylist() == [1]
