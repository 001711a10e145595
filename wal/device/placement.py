"""Where an append's frames go in the device ring (pure: no I/O, no locks).

A plan walks the frames from the write position: it opens a block, seals it when the
next frame does not fit or it reached ``max_block_bytes``, and fills the ring's physical
end with a PADDING record (or zeros, under a header's size) so no frame straddles it. The
writer runs the same plan twice when room is short: a dry run (``out`` None) for the exact
end, then for real, reading the steps it appends to ``out``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sediment.wal.device.format import align_up
from sediment.wal.record import HEADER_SIZE


@dataclass(slots=True)
class Plan:
    """Allocation state (the open block and the write position) and the ring's geometry."""

    next: int
    open: bool
    start: int
    fill: int
    cap: int
    block_size: int
    data_capacity: int
    pool_size: int
    max_block_bytes: int


def plan_seal(p: Plan, out: list | None) -> None:
    if p.open:
        p.open = False
        p.next = align_up(p.next, p.block_size)
        if out is not None:
            out.append(("seal",))


def plan_block(p: Plan, n: int, out: list | None) -> int:
    """Reserve ``n`` bytes in the open block (opening or sealing as needed); the caller has
    made sure they do not cross the ring end."""
    if p.open and p.fill + n > p.cap:
        plan_seal(p, out)
    if not p.open:
        p.open, p.start, p.fill = True, p.next, 0
        p.cap = p.pool_size if n <= p.pool_size else align_up(n, p.block_size)
        if out is not None:
            out.append(("open", p.start, p.cap))
    lsn = p.next
    p.fill += n
    p.next += n
    return lsn


def plan_frame(p: Plan, n: int, out: list | None) -> int:
    d = p.data_capacity
    while True:
        phys = p.next % d
        if phys + n <= d:
            break
        gap = d - phys
        if gap < HEADER_SIZE:
            p.fill += gap
            p.next += gap
            if out is not None:
                out.append(("zeros", gap))
        elif p.open and p.fill + gap > p.cap:
            plan_seal(p, out)
            continue
        else:
            lsn = plan_block(p, gap, out)
            if out is not None:
                out.append(("pad", lsn, gap))
        plan_seal(p, out)
    lsn = plan_block(p, n, out)
    if out is not None:
        out.append(("frame", lsn, n))
    if p.fill >= p.max_block_bytes:
        plan_seal(p, out)
    return lsn


def plan_call(p: Plan, sizes: Sequence[int], fsize: int, out: list | None) -> int:
    """Plan frames of ``sizes`` (and a FRONTIERS record of ``fsize`` bytes, sealed after
    it); the block-aligned end they reach."""
    for n in sizes:
        plan_frame(p, n, out)
    if fsize:
        plan_frame(p, fsize, out)
        plan_seal(p, out)
    return align_up(p.next, p.block_size)
