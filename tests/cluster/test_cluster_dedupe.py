"""The owner's idempotency bookkeeping (sediment.cluster.dedupe), exhaustively against a model.

Every sequence of up to 5 events over two clients (an append or a retry with numbers 1-3
arriving in any order, the oldest append in flight becoming durable, the newest refused with
nothing written, the owner crashing with 0-2 of its in-flight appends already in the log and
a new owner rebuilding the table from the log), and of 6 events over one client: each
answer must match what the log and the flight hold at that moment, and the log must hold each
client's numbers 1, 2, ... once each, in order.
"""

from __future__ import annotations

import itertools

import pytest

from sediment.cluster.dedupe import Dedupe, Verdict
from sediment.errors import InvalidIdempotencyKey, NothingWritten


class World:
    """One partition: its durable log, the appends in flight (log order), the owner's table."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.table = Dedupe(keep)
        self.log: list[tuple[str, int, str]] = []
        self.flight: list[tuple[str, int]] = []

    def send(self, client: str, seq: int) -> None:
        mine = [s for c, s, _ in self.log if c == client]
        results = [(s, r) for c, s, r in self.log if c == client]
        flying = [s for c, s in self.flight if c == client]
        d = self.table.check(client, seq)
        assert d.expected == max(mine + flying, default=0) + 1
        if seq in mine:
            kept = dict(results[-self.keep:]) if self.keep else {}
            assert d.verdict is Verdict.DUPLICATE and d.result == kept.get(seq), (d, self.log)
        elif seq in flying:
            assert d.verdict is Verdict.IN_FLIGHT
        elif seq == d.expected:
            assert d.verdict is Verdict.APPLY
            self.table.begin(client, seq)
            self.flight.append((client, seq))
        else:
            assert d.verdict is Verdict.OUT_OF_ORDER
            with pytest.raises(InvalidIdempotencyKey):
                self.table.begin(client, seq)

    def durable(self) -> None:
        if self.flight:
            client, seq = self.flight.pop(0)
            result = f"lsn{len(self.log)}"
            self.log.append((client, seq, result))
            self.table.applied(client, seq, result)

    def refused(self) -> None:
        if self.flight:
            client, seq = self.flight.pop()
            self.table.abandoned(client, seq)

    def crash(self, written: int) -> None:
        for client, seq in self.flight[:written]:
            self.log.append((client, seq, f"lsn{len(self.log)}"))
        self.flight = []
        self.table = Dedupe.from_log(self.log, self.keep)

    def check_log(self) -> None:
        for client in {c for c, _, _ in self.log}:
            seqs = [s for c, s, _ in self.log if c == client]
            assert seqs == list(range(1, len(seqs) + 1)), f"{client}: {seqs}"
            assert self.table.last(client) == len(seqs)


def events(clients: str, numbers: int) -> list[tuple]:
    return ([("send", c, s) for c in clients for s in range(1, numbers + 1)]
            + [("durable",), ("refused",), ("crash", 0), ("crash", 1), ("crash", 2)])


def run(history, keep: int) -> None:
    w = World(keep)
    for ev in history:
        getattr(w, ev[0])(*ev[1:])
        w.check_log()


@pytest.mark.parametrize("keep, longest", [(1, 5), (8, 4)])
def test_every_history_of_two_clients(keep: int, longest: int) -> None:
    alphabet = events("ab", 3)
    for length in range(longest + 1):
        for history in itertools.product(alphabet, repeat=length):
            run(history, keep)


def test_every_longer_history_of_one_client() -> None:
    alphabet = events("a", 3)
    for history in itertools.product(alphabet, repeat=6):
        run(history, keep=2)


def test_a_retry_after_failover_returns_the_first_write_result() -> None:
    """The old owner wrote append 1 and died before answering; the new owner, rebuilt from the
    log, answers the retry with success and the original result, and writes nothing."""
    old = Dedupe()
    old.begin("c", 1)
    old.applied("c", 1, "lsn 41")
    new = Dedupe.from_log([("c", 1, "lsn 41")])
    d = new.check("c", 1)
    assert d.verdict is Verdict.DUPLICATE and d.result == "lsn 41" and d.expected == 2
    assert new.check("c", 3).verdict is Verdict.OUT_OF_ORDER


@pytest.mark.parametrize("client, seq", [("", 1), (None, 1), ("c", 0), ("c", -2), ("c", True), ("c", 1.0)])
def test_bad_keys_are_refused_with_nothing_changed(client, seq) -> None:
    t = Dedupe()
    t.begin("c", 1)
    with pytest.raises(InvalidIdempotencyKey) as err:
        t.check(client, seq)
    assert isinstance(err.value, NothingWritten)
    assert t.check("c", 2).verdict is Verdict.APPLY and t.last("c") == 0


def test_completions_out_of_turn_are_refused() -> None:
    t = Dedupe()
    t.begin("c", 1)
    t.begin("c", 2)
    with pytest.raises(InvalidIdempotencyKey):
        t.applied("c", 2)  # 1 is older
    with pytest.raises(InvalidIdempotencyKey):
        t.abandoned("c", 1)  # 2 is newer
    with pytest.raises(InvalidIdempotencyKey):
        Dedupe.from_log([("c", 1, None), ("c", 3, None)])
    with pytest.raises(InvalidIdempotencyKey):
        Dedupe(keep=-1)
    t.applied("c", 1)
    assert t.check("c", 1).verdict is Verdict.DUPLICATE and t.check("c", 2).verdict is Verdict.IN_FLIGHT
