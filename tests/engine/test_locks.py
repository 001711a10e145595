"""Optimistic locks on appends: the conflict rules case by case, and read-modify-write under contention."""

from __future__ import annotations

import random
import threading

import pyarrow as pa
import pytest

from sediment import Locks, errors
from sediment.engine.locks import LockTable, slot_of

SCHEMA = pa.schema([("account", pa.string()), ("balance", pa.int64())])


def row(account, balance, t, diff=1):
    return pa.table({"account": [account], "balance": pa.array([balance], pa.int64()),
                     "time": pa.array([t], pa.int64()), "diff": pa.array([diff], pa.int64())})


def test_table_rules_case_by_case():
    table = LockTable(slots=1 << 12)
    a, b = ("acct", 1), ("acct", 2)
    table.check_and_record(Locks(high_water=0, write=[a]), t=5)  # first write: no conflict
    with pytest.raises(errors.LockConflict) as err:  # a was written at 5, after this reader's 3
        table.check_and_record(Locks(high_water=3, write=[a]), t=6)
    assert err.value.time == 5 and err.value.lock == a
    with pytest.raises(errors.LockConflict):  # a read lock conflicts the same way
        table.check(Locks(high_water=4, read=[a]))
    table.check(Locks(high_water=5, read=[a]))  # read at 5 saw the write: fine
    table.check_and_record(Locks(high_water=0, append=[a]), t=9)  # append locks never conflict...
    with pytest.raises(errors.LockConflict) as err:  # ...but record their time
        table.check(Locks(high_water=5, write=[a]))
    assert err.value.time == 9
    table.check(Locks(high_water=0, write=[b]) if slot_of(a, 1 << 12) != slot_of(b, 1 << 12) else Locks(0))
    table.check_and_record(Locks(high_water=0, read=[b]), t=20)  # read locks record nothing
    table.check(Locks(high_water=0, write=[b]) if slot_of(a, 1 << 12) != slot_of(b, 1 << 12) else Locks(0))


def test_failed_check_records_nothing():
    table = LockTable(slots=1 << 12)
    table.record(Locks(0, write=[("x", 1)]), 10)
    with pytest.raises(errors.LockConflict):
        table.check_and_record(Locks(high_water=5, write=[("x", 1), ("y", 2)]), t=11)
    table.check(Locks(high_water=0, write=[("y", 2)]))


def test_false_conflict_rate_at_the_default_size_is_small():
    rnd = random.Random(1)
    table = LockTable()
    for i in range(1000):
        table.record(Locks(0, write=[("w", i)]), 100)
    conflicts = 0
    trials = 2000
    for _ in range(trials):
        try:
            table.check(Locks(high_water=50, write=[("other", rnd.random()) for _ in range(10)]))
        except errors.LockConflict:
            conflicts += 1
    assert conflicts / trials < 0.03  # expected about 1 - (1 - 1000/2**20)**10, i.e. ~1%


@pytest.mark.embedded_only  # reads eng.wal
def test_engine_lock_conflict_writes_nothing(open_engine):
    eng = open_engine()
    eng.add_relation("acct", SCHEMA)
    eng.append("acct", row("a", 100, 1), locks=Locks(high_water=0, write=[("acct", "a")]))
    eng.seal("acct", 1)
    end = eng.wal.end_lsn
    with pytest.raises(errors.LockConflict) as err:
        eng.append("acct", row("a", 50, 2), locks=Locks(high_water=0, write=[("acct", "a")]))
    assert err.value.time == 1
    assert eng.wal.end_lsn == end
    eng.append("acct", row("a", 50, 2), locks=Locks(high_water=1, write=[("acct", "a")]))


def test_locks_survive_restart_conservatively(open_engine):
    eng = open_engine()
    eng.add_relation("acct", SCHEMA)
    eng.append("acct", row("a", 1, 7), locks=Locks(0, write=[("acct", "a")]))
    eng.close()
    eng = open_engine()
    with pytest.raises(errors.LockConflict):  # history is gone: conflicts are conservative, never missed
        eng.append("acct", row("a", 2, 8), locks=Locks(high_water=6, write=[("acct", "a")]))
    eng.append("acct", row("a", 2, 8), locks=Locks(high_water=7, write=[("acct", "a")]))


def test_contended_read_modify_write_keeps_balances_exact(open_engine):
    """Many clients move money between a few accounts with optimistic retries; the total
    is conserved and every transfer is applied exactly once."""
    eng = open_engine()
    eng.add_relation("acct", SCHEMA)
    accounts = ["a", "b", "c"]
    t0 = 1
    eng.append_many({"acct": pa.concat_tables([row(x, 100, t0) for x in accounts])})
    eng.seal("acct", t0)
    clock = {"t": t0}
    clock_lock = threading.Lock()
    done = []

    def next_time():
        with clock_lock:
            clock["t"] += 1
            return clock["t"]

    def client(seed):
        rnd = random.Random(seed)
        for _ in range(15):
            src, dst = rnd.sample(accounts, 2)
            while True:
                with clock_lock:
                    as_of = eng.sealed("acct")
                    snap = {r["account"]: r["balance"] for r in eng.snapshot("acct", as_of).to_pylist()}
                t = next_time()
                change = pa.concat_tables([row(src, snap[src], t, -1), row(src, snap[src] - 1, t),
                                           row(dst, snap[dst], t, -1), row(dst, snap[dst] + 1, t)])
                try:
                    eng.append("acct", change, locks=Locks(high_water=as_of, write=[("acct", src), ("acct", dst)]))
                except (errors.LockConflict, errors.TimeAlreadySealed):  # stale read, or overtaken: retry
                    continue
                finally:
                    with clock_lock:
                        eng.seal("acct", max(eng.sealed("acct"), t))
                done.append(1)
                break

    threads = [threading.Thread(target=client, args=(s,)) for s in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    final = {r["account"]: (r["balance"], r["diff"]) for r in eng.snapshot("acct", eng.sealed("acct")).to_pylist()}
    assert len(done) == 90
    assert all(d == 1 for _b, d in final.values()) and len(final) == 3
    assert sum(b for b, _d in final.values()) == 300
