"""The bell a server's shared stream sleeps on (engine/feed_bells.py), hung on an engine
subscription's feed: rung by the feed's writer (which also drops laggards), the
subscription's close or the engine's close; and a ring that comes before the wait. Real
engine."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

import sediment
from sediment.engine.feed_bells import Bell

SCHEMA = pa.schema([("k", pa.int64())])


def row(k: int) -> pa.Table:
    return pa.table({"k": pa.array([k], pa.int64()), "time": pa.array([k + 1], pa.int64()),
                     "diff": pa.array([1], pa.int64())})


@pytest.fixture
def engine(tmp_path):
    eng = sediment.open(str(tmp_path / "data"))
    eng.add_relation("r", SCHEMA)
    eng.seal("r", 0)
    yield eng
    eng.close()


def _caught_up(sub) -> None:
    while sub.next(timeout=0) is not None:
        pass


def _rung_by(bell: Bell, action) -> bool:
    """Whether ``action``, run on another thread, ends a wait on ``bell`` (the wait is long
    enough that only a ring ends it within the test's run)."""
    bell.arm()
    thread = threading.Thread(target=action, daemon=True)
    thread.start()
    rung = bell.wait(30)
    thread.join()
    return rung


@pytest.mark.parametrize("what", ["append", "close", "engine close"])
def test_a_bell_hung_on_a_subscription_is_rung_by_its_feed(engine, what):
    sub = engine.subscribe("r")
    _caught_up(sub)
    bell = Bell()
    sub.hang(bell)
    action = {"append": lambda: engine.append("r", row(1)), "close": sub.close, "engine close": engine.close}[what]
    assert _rung_by(bell, action), f"a {what} did not ring the bell"


def test_a_bell_rung_before_the_wait_ends_it_at_once_and_arm_forgets_it():
    bell = Bell()
    bell.ring()
    bell.ring()  # twice: no error, one wake-up
    assert bell.wait(10)
    assert not bell.wait(0.01)
    bell.ring()
    bell.arm()
    assert not bell.wait(0.01), "arm kept a ring from before it"
