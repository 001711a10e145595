"""Feeds read from asyncio in tests: a coroutine run by ``asyncio.run`` in a thread of its
own, and the keys of a subscription's updates read with ``async for`` or from a thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any


def in_loop(coro: Coroutine[Any, Any, Any]) -> tuple[threading.Thread, dict]:
    """Run ``coro`` by ``asyncio.run`` in a thread of its own; its result or error lands in the dict."""
    out: dict = {}

    def run() -> None:
        try:
            out["result"] = asyncio.run(coro)
        except BaseException as e:  # handed to the test's thread
            out["error"] = e

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th, out


async def async_keys(sub: Any, n: int) -> list[int]:
    """The ``k`` column of ``sub``'s updates, read with ``async for`` until ``n`` have come (or it ends)."""
    got: list[int] = []
    async for event in sub:
        if event.kind == "updates":
            got.extend(event.table.column("k").to_pylist())
            if len(got) >= n:
                break
    return got


def thread_keys(sub: Any, n: int, out: list[int]) -> None:
    """The same, iterating ``sub`` in the calling thread, into ``out``."""
    for event in sub:
        if event.kind == "updates":
            out.extend(event.table.column("k").to_pylist())
            if len(out) >= n:
                return


async def cancel_reads(sub: Any, times: int = 1) -> None:
    """Start ``times`` reads of ``sub`` one after another, each cancelled while it waits."""
    for _ in range(times):
        task = asyncio.ensure_future(sub.next_async())
        await asyncio.sleep(0)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            continue
        raise AssertionError(f"a cancelled read returned {task.result()!r}")
