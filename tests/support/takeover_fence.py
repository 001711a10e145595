"""Helpers of the takeover-fence tests (tests/engine/test_takeover_fence.py,
tests/wal/test_replicated_fence.py): a trace commit held between its batch PUTs and its
compare-and-set while a newer coordinator opens."""

from __future__ import annotations

import threading

import pyarrow as pa

SCHEMA = pa.schema([("k", pa.int64())])


def ups(ks: list[int], t: int) -> pa.Table:
    return pa.table({"k": pa.array(ks, pa.int64()), "time": pa.array([t] * len(ks), pa.int64()),
                     "diff": pa.array([1] * len(ks), pa.int64())})


def s3_options(endpoint: str, bucket: str) -> dict:
    return {"wal": f"s3://{bucket}/wal", "metadata": f"s3://{bucket}/meta?endpoint={endpoint}",
            "blob": f"s3://{bucket}/blobs", "s3_endpoint": endpoint, "compact_interval": 3600.0}


def keys(eng, name: str, t: int) -> list[int]:
    return sorted(eng.snapshot(name, t).column("k").to_pylist())


class HeldCommit:
    """Holds the old coordinator's trace commits that ``when(new_state)`` picks, between its
    batch PUTs and its compare-and-set, until :meth:`release`: the commit then runs as written."""

    def __init__(self, engine, when=lambda new: True) -> None:
        self.reached, self._release = threading.Event(), threading.Event()
        real = engine.traces.commit

        def held(new):
            if when(new):
                self.reached.set()
                assert self._release.wait(60)
            return real(new)

        engine.traces.commit = held

    def release(self) -> None:
        self._release.set()


def in_thread(call):
    """Run ``call`` in a thread; the returned dict gets its ``error`` (or ``result``) and ``done``."""
    out: dict = {"done": threading.Event()}

    def run() -> None:
        try:
            out["result"] = call()
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            out["error"] = exc
        finally:
            out["done"].set()

    threading.Thread(target=run, daemon=True).start()
    return out


def closed_event(engine) -> threading.Event:
    closed = threading.Event()
    engine.superseded_listeners.append(lambda _err: closed.set())
    return closed
