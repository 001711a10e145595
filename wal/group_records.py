"""A group commit's small appends joined into one record.

Why: with 64 writers appending one row each, a group holds about 30 one-record appends,
and each record cost the leader its own frame and CRC and cost the owner's ``on_durable``
its own tail entry, feed event and cached body, all with the interpreter lock held while
the other writers wait for it. Here each run of two or more consecutive *joinable*
appends in a group (each a single plain UPDATES record, txn 0, submitted as joinable; the
same relation, schema version and callback) becomes one record whose body is a group body
(sediment/arrow_codec.py ``join_updates``: the appends' messages in queue order after a
small header), written, acknowledged and applied as one. The appends in it were each
admitted on their own before they were queued, so a refused append is simply not there;
the group's appends are acknowledged after the one fdatasync either way.

A joinable append may also leave its body to the leader: it carries its validated table
(``GroupAppend.table``) and a bound on its body's size instead. A run of those is one
append of all their rows, so the leader encodes the run's tables as one plain UPDATES body
(one IPC message, the rows in queue order; ``encode_joined_tables``) and an append alone as
its own. Why: with 64 one-row writers, reading each table's columns through pyarrow's
wrappers to encode it was the largest share of the appenders' time holding the
interpreter lock; the leader's one encode per run replaces those walks.
"""

from __future__ import annotations

from sediment.arrow_codec import GROUP_HEADER, encode_joined_tables, join_updates
from sediment.wal import record as rec
from sediment.wal.group_commit import GroupAppend

MAX_JOINED_BODY = 1 << 20  # a run stops growing here, or at the engine's max_record_bytes if smaller
_UPDATES = rec.RecordKind.UPDATES


def join_group(batch: list[GroupAppend]) -> tuple[list[GroupAppend], list[tuple[GroupAppend, list[GroupAppend]]]]:
    """``batch`` as written: each run of joinable appends replaced by one append of the
    joined record; and the ``(joined, members)`` pairs, whose members take the joined
    record's LSN once it is written (:func:`settle_joined`). ``batch`` itself (its appends
    that left their bodies to the leader encoded in place) when nothing joins."""
    out: list[GroupAppend] = []
    joined: list[tuple[GroupAppend, list[GroupAppend]]] = []
    run: list[GroupAppend] = []
    key = None
    size = 0
    for p in batch:
        if p.joinable:
            r = p.records[0]
            k = (r.relation_id, r.schema_version, p.on_durable, p.table is not None)
            n = len(r.body) if p.table is None else p.size
            if run and k == key and size + n + GROUP_HEADER.size <= run[0].joinable:
                run.append(p)
                size += n
                continue
            _close_run(run, out, joined)
            run, key, size = [p], k, n
            continue
        _close_run(run, out, joined)
        run = []
        out.append(p)
    _close_run(run, out, joined)
    return (out, joined) if joined else (batch, joined)


def encode_alone(p: GroupAppend) -> None:
    """An append that left its body to the leader, written alone: its table as its body."""
    body = encode_joined_tables([p.table])
    p.records[0].body = body
    p.crcs = [rec.crc32c_raw(body)]
    p.table = None


def _close_run(run: list[GroupAppend], out: list[GroupAppend],
               joined: list[tuple[GroupAppend, list[GroupAppend]]]) -> None:
    if not run:
        return
    body = None
    if run[0].table is not None:
        if len(run) > 1:
            body = encode_joined_tables([p.table for p in run])
        if body is None or len(body) > run[0].joinable:  # the size bound held, so never; if not, one by one
            for p in run:
                encode_alone(p)
                out.append(p)
            return
        for p in run:
            p.table = None
    if len(run) == 1:
        out.append(run[0])
    else:
        records = [p.records[0] for p in run]
        first = records[0]
        if body is None:
            body = join_updates([r.body for r in records])
        record = rec.Record(_UPDATES, first.relation_id, 0, min(r.t_lo for r in records),
                            max(r.t_hi for r in records), sum(r.count for r in records), body,
                            schema_version=first.schema_version, appends=len(records))
        one = GroupAppend(None, [record], [rec.crc32c_raw(body)], run[0].on_durable)
        out.append(one)
        joined.append((one, run))


def settle_joined(joined: list[tuple[GroupAppend, list[GroupAppend]]]) -> None:
    """After the write: each joined append's members (and their records) get its LSN."""
    for one, members in joined:
        lsn = one.last_lsn
        for p in members:
            p.last_lsn = lsn
            p.records[0].lsn = lsn
