"""Claiming the log on S3 (docs/formats.md, "Log on S3", "Opening"): how an open takes the
log over from a writer that may still be appending, within a bounded number of requests.

A writer fills its slots one after another, one PUT in flight, each a conditional create;
it can only write the slot after its last one. So one object in a slot the writer has not
reached fences it: its PUT there fails, and it can never write past it. A claim at the
slot after the newest object is such a fence, but a writer appending back to back usually
takes that slot while the open lists and reads (session 31: 32 lost rounds and a failed
open). So a lost round claims further ahead, without listing again: 1, 3, 7, 15, 31, 63
slots past the newest object listed, then 64 more a round. The claim lands once it is
further ahead than the writer gets during one of this open's PUTs.

A claim ahead does not know the log's end when it is written (the writer may still add
objects below it), so it carries what the open last saw and the log reads its end from the
object before it. The open then settles every slot between the newest object and its claim
in slot order: it reads the old writer's object there, or, where the slot is empty, creates
a PLUG (header only, conditional) that fences the old writer for good. Below the claim the
log is then whole again, with no gap, and everything the old writer acknowledged is in it:
the writer acknowledges an object only once S3 created it, in a slot the open reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sediment.errors import WalError
from sediment.wal import s3_format as fmt
from sediment.wal.s3_objects import Newest, SlotStore, check_follows, damaged, effective, fetch, read_newest

ROUNDS = 10
MAX_STEP = 64


@dataclass
class Claimed:
    """A claim that landed: its header as the log reads it (:func:`effective`); ``below``,
    the object just below it, likewise (its next LSN and start are the log's); ``known``, the
    objects between the newest one listed and the claim, as read or plugged; the rounds it
    took and the plugs it wrote."""

    head: fmt.ObjectHeader
    below: fmt.ObjectHeader
    known: dict[int, bytes] = field(default_factory=dict)
    rounds: int = 1
    plugs: int = 0


def create(store: SlotStore, partition: int) -> fmt.ObjectHeader | None:
    """The first claim of a new log (slot 0, epoch 1), or None when another open created it."""
    head = fmt.new_header(fmt.CLAIM, 1, 0, 0, 0, 0)
    return head if store.create(fmt.slot_name(partition, 0), fmt.encode(head, b"")) is True else None


def claim(store: SlotStore, partition: int, newest: Newest) -> Claimed:
    """Claim the log past ``newest``, then settle the slots below the claim (see the module doc)."""
    head, anchor, rounds = _claim(store, partition, newest)
    known, below, plugs = _settle(store, partition, anchor, head.slot)
    return Claimed(effective(head, below), below, known, rounds, plugs)


def _claim(store: SlotStore, partition: int, newest: Newest) -> tuple[fmt.ObjectHeader, fmt.ObjectHeader, int]:
    """The claim that landed, the newest object below it that knows the log's end, and the
    rounds it took. Its epoch is its slot + 1, above every epoch below it (a writer's epoch is
    its claim's slot + 1 at most), so two claims never share one. Only a claim right after
    that object knows the log's end: it is a plain CLAIM, as builds before session 32 write;
    any other is a claim ahead. A claim that landed in a slot the old writer had written and
    trimmed since (its objects are listed above the claim) fences nothing: it is left below
    the start, and the next round claims past the writer's newest object."""
    anchor, slot, step = newest.head, newest.slot + 1, 1
    for rounds in range(1, ROUNDS + 1):
        flags = fmt.CLAIM if slot == anchor.slot + 1 else fmt.CLAIM | fmt.AHEAD
        head = fmt.new_header(flags, slot + 1, slot, anchor.next_lsn, 0, anchor.start_slot)
        if store.create(fmt.slot_name(partition, slot), fmt.encode(head, b"")) is True:
            later = read_newest(store, partition, slot + 1)
            if later is None:
                return head, anchor, rounds
            anchor, slot = later.head, later.slot
        step = min(2 * step, MAX_STEP)
        slot += step
    raise WalError(f"{store.where(f'{partition}/')}: every slot this open tried to claim was taken first or trimmed "
                   f"({ROUNDS} rounds, up to slot {slot - step}, {slot - step - newest.slot} past the newest listed): "
                   "another writer wrote faster than this open's PUTs; open again, or stop that writer")


def _settle(store: SlotStore, partition: int, newest: fmt.ObjectHeader,
            claim_slot: int) -> tuple[dict[int, bytes], fmt.ObjectHeader, int]:
    """Read or plug every slot in ``(newest.slot, claim_slot)`` in slot order: the objects'
    bytes, the last one as the log reads it, the plugs written. The slots are read in parallel
    first: the old writer fills them in order, so those it has written are all read at once.

    An empty slot is plugged only if nothing but claims ahead is listed above it: the old
    writer may have gone past it and trimmed it meanwhile (a trim deletes whole objects below
    its new start), and then the settling goes on from the writer's newest object. Once a
    plug of ours landed the old writer is fenced, and the rest are tried with a create first
    (empty, unless another open is claiming too)."""
    known: dict[int, bytes] = {}
    prev, plugs, slot = newest, 0, newest.slot + 1
    seen = dict(zip(range(slot, claim_slot), fetch(store, partition, list(range(slot, claim_slot))), strict=True))
    while slot < claim_slot:
        name = fmt.slot_name(partition, slot)
        data = None if plugs else seen[slot] or store.get(name)
        if data is None and not plugs:
            later = read_newest(store, partition, slot, claim_slot)
            if later is not None:
                prev, slot = later.head, later.head.slot + 1
                continue
        if data is None:
            plug = fmt.encode(fmt.new_header(fmt.PLUG, slot + 1, slot, prev.next_lsn, 0, prev.start_slot), b"")
            made = store.create(name, plug)
            data = plug if made is True else store.get(name) if made is False else None
            plugs += made is True
        if data is None:
            raise WalError(f"{store.where(name)} was emptied while this open settled the slots below its claim "
                           f"(slot {claim_slot}): another open took the log over and trimmed it; open again")
        head = fmt.decode_header(data)
        if head is None or head.slot != slot:
            raise damaged(store, partition, slot, "object header is damaged")
        check_follows(store, partition, prev, head)
        prev = effective(head, prev)
        known[slot] = data
        slot += 1
    return known, prev, plugs
