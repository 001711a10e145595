"""A lone writer's one-row append runs through few, small Python frames.

Why it is a property worth a test: CPython 3.11 keeps frames on per-thread 16 KiB chunks and
frees a chunk as soon as its first frame returns, so at caller depths where the append's
calls cross a chunk's end, every such call allocates and frees a chunk (16 of 140 caller
depths paid 1.6x the CPU per append with 2.4 KiB of frames, bench/caller_depth.py). The
share of depths that pay grows with the room the append's deepest chain of frames takes,
so that chain is bounded here: a layer added on the path fails this test, not silently
the benchmark at some depth."""

from __future__ import annotations

import sys

import pyarrow as pa

import sediment

SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.binary())])
BOUND = 2048  # bytes of frames (estimated as CPython 3.11 sizes them) below Engine.append


def frame_bytes(code) -> int:  # noqa: ANN001 - a code object
    """A frame's room on the interpreter's stack: locals, cells, free variables, the value
    stack and the frame's own fields (about nine words)."""
    return (code.co_nlocals + len(code.co_cellvars) + len(code.co_freevars) + code.co_stacksize + 9) * 8


def deepest_chain(call) -> tuple[int, list[str]]:  # noqa: ANN001 - a callable
    """The most room the Python frames of ``call()`` took at once, and that chain's names."""
    stack: list[tuple[int, str]] = []
    deepest: tuple[int, list[str]] = (0, [])

    def profile(frame, event, _arg) -> None:  # noqa: ANN001
        nonlocal deepest
        if event == "call":
            top = (stack[-1][0] if stack else 0) + frame_bytes(frame.f_code)
            stack.append((top, frame.f_code.co_qualname))
            if top > deepest[0]:
                deepest = (top, [name for _b, name in stack])
        elif event == "return" and stack:
            stack.pop()

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return deepest


def test_a_lone_one_row_append_takes_a_bounded_chain_of_frames(tmp_path):
    with sediment.open(tmp_path / "data") as eng:
        eng.add_relation("r", SCHEMA)
        row = pa.table({"id": [1], "payload": [b"x" * 76], "time": [1], "diff": [1]},
                       schema=SCHEMA.append(pa.field("time", pa.int64())).append(pa.field("diff", pa.int64())))
        eng.append("r", row)  # warm: the first append of a relation takes other steps once
        room, chain = deepest_chain(lambda: eng.append("r", row))
        assert chain[0].endswith("<lambda>") and "Engine.append" in chain
        assert "FileLog._write_one" in chain, f"not the lone append's path: {chain}"
        assert room - frame_bytes((lambda: None).__code__) <= BOUND, \
            f"{room} bytes of frames below the caller: {' > '.join(chain)}"
        eng.seal("r", 1)
        assert eng.snapshot("r", 1).column("diff").to_pylist() == [2]  # both appends, consolidated
