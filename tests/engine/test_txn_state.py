"""The transaction state machine both kinds of transaction share (sediment/txn_state.py),
against a model over every sequence of up to five operations."""

from __future__ import annotations

import itertools

import pytest

from sediment.errors import TransactionError
from sediment.txn_state import ABORTED, COMMITTED, OPEN, TxnState

OPS = [("finish", COMMITTED), ("finish", ABORTED), ("settle", COMMITTED), ("settle", ABORTED),
       ("settle", OPEN), ("settle", "unknown"), ("check", None)]


def model(ops):
    """(final state, how many checks raised)."""
    state, refused = OPEN, 0
    for op, arg in ops:
        if op == "finish":
            state = arg if state == OPEN else state
        elif op == "settle":
            state = arg if arg in (COMMITTED, ABORTED) else ABORTED
        elif state != OPEN:
            refused += 1
    return state, refused


@pytest.mark.parametrize("length", range(6))
def test_every_sequence_matches_the_model(length):
    for ops in itertools.product(OPS, repeat=length):
        txn = TxnState(0x2A)
        refused = 0
        for op, arg in ops:
            if op == "finish":
                txn.finish(arg)
            elif op == "settle":
                txn.settle(arg)
            else:
                try:
                    txn.check_open()
                except TransactionError as exc:
                    assert str(exc) == f"transaction 0x2a is already {txn.value}"
                    refused += 1
            assert txn.is_open == (txn.value == OPEN)
        assert (txn.value, refused) == model(ops), ops


def test_finish_takes_only_a_final_state():
    with pytest.raises(ValueError, match="committed or aborted"):
        TxnState(1).finish(OPEN)
