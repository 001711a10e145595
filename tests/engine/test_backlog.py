"""The WAL backlog bound: appends wait for compaction past ``max_wal_backlog``, then fail typed.

Compaction is slowed by a real file blob store behind a gate the test opens and closes
(no mock of the engine, no sleeps): the compacter blocks inside its put until the gate
opens, so a writer outruns it for as long as the test wants.
"""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

import sediment
from sediment import errors
from sediment.blob.file import FileBlobStore

SCHEMA = pa.schema([("k", pa.int64()), ("payload", pa.binary())])
MiB = 1 << 20


class GatedStore:
    """A FileBlobStore whose writes wait for ``gate`` (set: open)."""

    def __init__(self, root: str) -> None:
        self.inner = FileBlobStore(root)
        self.gate = threading.Event()
        self.gate.set()
        self.blocked = threading.Condition()
        self.waiting = 0

    def _wait(self) -> None:
        with self.blocked:
            self.waiting += 1
            self.blocked.notify_all()
        try:
            assert self.gate.wait(120), "the test never opened the gate"
        finally:
            with self.blocked:
                self.waiting -= 1

    def put_if_absent(self, key, data):
        self._wait()
        return self.inner.put_if_absent(key, data)

    def put_file(self, key, path, *, if_absent=False):
        self._wait()
        return self.inner.put_file(key, path, if_absent=if_absent)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def rows(start: int, n: int, size: int = 16 << 10) -> pa.Table:
    return pa.table({"k": pa.array(range(start, start + n), pa.int64()),
                     "payload": pa.array([b"x" * size] * n, pa.binary()),
                     "time": pa.array(range(start, start + n), pa.int64()),
                     "diff": pa.array([1] * n, pa.int64())})


def open_gated(tmp_path, **options):
    store = GatedStore(str(tmp_path / "blobs"))
    eng = sediment.open(str(tmp_path / "data"), blob=store, segment_bytes=256 << 10, compact_interval=None,
                        **options)
    eng.add_relation("r", SCHEMA)
    return eng, store


def wait_backlog(eng, predicate, timeout=60.0) -> bool:
    with eng.view.lock:
        return eng.view.backlog.wait_for(predicate, timeout)


def test_a_writer_outrunning_compaction_stays_under_the_bound(tmp_path):
    bound = 1 * MiB
    eng, store = open_gated(tmp_path, max_wal_backlog=bound, wal_backlog_timeout=120.0)
    store.gate.clear()
    seen: list[int] = []
    failed: list[BaseException] = []
    total = 160  # 16 KiB each: 2.5 MiB, 2.5x the bound

    def writer():
        try:
            for i in range(0, total, 4):
                eng.append("r", rows(i, 4))
                seen.append(eng.stats()["wal"]["backlog_bytes"])
                eng.seal("r", i + 3)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failed.append(exc)
        finally:
            with eng.view.lock:  # the test waits on the backlog's condition for this end too
                finished.set()
                eng.view.backlog.wake_all()

    finished = threading.Event()
    thread = threading.Thread(target=writer)
    thread.start()
    cycles = 0
    while not finished.is_set():
        if not wait_backlog(eng, lambda: eng.view.backlog.waiting > 0 or finished.is_set()):
            break
        if finished.is_set():
            break
        cycles += 1
        stats = eng.stats()["wal"]
        assert stats["backlog_waiting_appends"] == 1 and stats["backlog_bytes"] <= bound
        assert b"sediment_wal_backlog_bytes" in eng.metrics.exposition()
        store.gate.set()  # let compaction catch up, then close the gate again
        assert wait_backlog(eng, lambda: eng.view.backlog.waiting == 0 or finished.is_set())
        store.gate.clear()
    store.gate.set()
    thread.join(120)
    assert not failed, failed
    assert cycles >= 2, "the writer never had to wait: the test did not outrun compaction"
    assert max(seen) <= bound
    assert eng.metrics.backlog_waits._value.get() >= cycles
    got = eng.snapshot("r", total - 1)
    assert got.column("k").to_pylist() == list(range(total))
    eng.close()


def test_the_append_fails_typed_after_the_timeout_and_writes_nothing(tmp_path):
    bound = 1 * MiB
    eng, store = open_gated(tmp_path, max_wal_backlog=bound, wal_backlog_timeout=0.2)
    store.gate.clear()
    i = 0
    with pytest.raises(errors.WalBacklogFull) as info:
        while i < 1000:
            eng.append("r", rows(i, 4))
            i += 4
    exc = info.value
    assert isinstance(exc, errors.NothingWritten) and exc.retryable
    assert exc.bound == bound and 0 < exc.backlog <= bound
    assert "max_wal_backlog" in str(exc) and "Nothing was written" in str(exc)
    refused = list(range(i, i + 4))
    end = eng.wal.end_lsn
    store.gate.set()
    eng.seal("r", i + 10)
    assert eng.wal.end_lsn == end + 1, "only the seal reached the log"
    eng.compact()
    assert eng.snapshot("r", i + 10).column("k").to_pylist() == list(range(i))
    eng.close()
    again = sediment.open(str(tmp_path / "data"), blob=GatedStore(str(tmp_path / "blobs")))
    ks = again.snapshot("r", i + 10).column("k").to_pylist()
    assert ks == list(range(i)) and not set(refused) & set(ks)
    again.close()


def test_close_wakes_a_waiting_append(tmp_path):
    eng, store = open_gated(tmp_path, max_wal_backlog=MiB, wal_backlog_timeout=120.0)
    store.gate.clear()
    outcome: list[BaseException] = []

    def writer():
        try:
            for i in range(0, 1000, 4):
                eng.append("r", rows(i, 4))
        except BaseException as exc:  # noqa: BLE001
            outcome.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    assert wait_backlog(eng, lambda: eng.view.backlog.waiting > 0)
    closer = threading.Thread(target=eng.close)
    closer.start()  # wakes the writer at once; then waits for the compacter's blocked pass
    thread.join(60)
    assert not thread.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], errors.EngineClosed)
    store.gate.set()
    closer.join(60)
    assert not closer.is_alive()


def test_the_bound_and_timeout_are_validated(tmp_path):
    for bad in (0, -1, 1.5, True, "1G", 1024):
        with pytest.raises(errors.InvalidArgument, match="max_wal_backlog"):
            sediment.open(str(tmp_path / "x"), max_wal_backlog=bad)
    for bad in (-1, float("nan"), "5"):
        with pytest.raises(errors.InvalidArgument, match="wal_backlog_timeout"):
            sediment.open(str(tmp_path / "x"), wal_backlog_timeout=bad)
    with sediment.open(str(tmp_path / "y"), max_wal_backlog=None) as eng:
        assert eng.stats()["wal"]["backlog_bound_bytes"] is None


def test_the_backlog_count_equals_the_tail_it_stands_for(tmp_path):
    """The running count (kept per record) against the sum over tails and open transactions,
    through appends, transactions, an abort, compaction, a drop and a reopen."""
    eng = sediment.open(str(tmp_path / "d"), compact_interval=None)

    def recount(e):
        with e.view.lock:
            tails = sum(x.bytes for r in e.view.relations.values() for x in r.tail)
            txns = sum(x.bytes for x in e.view.txns.entries())
            return tails + txns, e.view.backlog.bytes

    eng.add_relation("r", SCHEMA)
    eng.add_relation("s", SCHEMA)
    eng.append("r", rows(0, 3, 100))
    eng.append_many({"r": rows(3, 2, 100), "s": rows(0, 5, 100)})
    txn = eng.transaction()
    txn.append("s", rows(10, 2, 100))
    a, b = recount(eng)
    assert a == b > 0
    txn.abort()
    a, b = recount(eng)
    assert a == b > 0
    eng.seal("r", 4)
    eng.compact()
    a, b = recount(eng)
    assert a == b
    eng.drop_relation("s")
    a, b = recount(eng)
    assert a == b
    eng.append("r", rows(100, 2, 100))
    before = recount(eng)
    eng.close()
    again = sediment.open(str(tmp_path / "d"), compact_interval=None)
    assert recount(again) == before and before[0] > 0
    again.close()


def test_the_cli_passes_the_bound(tmp_path, capsys):
    import json

    from sediment.cli import main

    d = str(tmp_path / "cli")
    assert main(["--data-dir", d, "relation", "add", "r", "--schema", "k:int64"]) == 0
    capsys.readouterr()
    assert main(["--data-dir", d, "--max-wal-backlog", str(2 * MiB), "stats", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["wal"]["backlog_bound_bytes"] == 2 * MiB
    assert main(["--data-dir", d, "--max-wal-backlog", "1000", "stats", "--json"]) != 0
    assert "max_wal_backlog" in capsys.readouterr().err


def test_the_cli_passes_the_major_compaction_quiet_time(tmp_path, capsys):
    import json

    from sediment.cli import main

    d = str(tmp_path / "cli")
    assert main(["--data-dir", d, "relation", "add", "r", "--schema", "k:int64"]) == 0
    capsys.readouterr()
    assert main(["--data-dir", d, "stats", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["compaction"]["major_compaction_quiet"] == 10.0
    for given, shown in (("2.5", 2.5), ("never", None)):
        assert main(["--data-dir", d, "--major-compaction-quiet", given, "stats", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["compaction"]["major_compaction_quiet"] == shown
    assert main(["--data-dir", d, "--major-compaction-quiet", "-1", "stats"]) != 0
    assert "seconds >= 0 or 'never'" in capsys.readouterr().err


def test_a_transaction_append_is_bounded_too(tmp_path):
    """A transaction's records count (they stay in the log until it ends, holding back the
    cut): its appends past the bound fail typed, and the transaction can still be aborted."""
    eng, store = open_gated(tmp_path, max_wal_backlog=MiB, wal_backlog_timeout=0.2)
    store.gate.clear()
    txn = eng.transaction()
    i = 0
    with pytest.raises(errors.WalBacklogFull):
        while i < 1000:
            txn.append("r", rows(i, 4))
            i += 4
    txn.abort()
    store.gate.set()
    eng.seal("r", 2000)
    eng.compact()
    assert eng.snapshot("r", 2000).num_rows == 0
    assert eng.stats()["wal"]["backlog_bytes"] == 0
    eng.close()
