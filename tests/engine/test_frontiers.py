"""engine/frontiers.py: the engine's sealed-frontier book, which the logs consult at each
segment boundary without reading payloads. Pure logic, checked against a brute-force model."""

from __future__ import annotations

import random

from sediment.engine.frontiers import SealedFrontiers, fold
from sediment.wal.record import Record, RecordKind, decode_frontiers, encode_frontiers


def _random_records(rng: random.Random, n: int) -> list[Record]:
    out = []
    for _ in range(n):
        roll = rng.random()
        if roll < 0.5:
            out.append(Record(RecordKind.PROGRESS, relation_id=rng.randrange(4), t_lo=0, t_hi=rng.randrange(50)))
        elif roll < 0.7:
            fr = {rng.randrange(4): rng.randrange(50) for _ in range(rng.randrange(3))}
            out.append(Record(RecordKind.FRONTIERS, count=len(fr), body=encode_frontiers(fr)))
        else:
            out.append(Record(RecordKind.UPDATES, relation_id=rng.randrange(4), t_lo=80, t_hi=99, body=b"x"))
    return out


def _model(records: list[Record]) -> dict[int, int]:
    """Every (relation, t) any PROGRESS or FRONTIERS record names, then the greatest t."""
    pairs = [(r.relation_id, r.t_hi) for r in records if r.kind == RecordKind.PROGRESS]
    for r in records:
        if r.kind == RecordKind.FRONTIERS:
            pairs += list(decode_frontiers(r.body).items())
    return {rel: max(t for q, t in pairs if q == rel) for rel in {q for q, _ in pairs}}


def test_fold_and_record_match_the_model_for_random_logs() -> None:
    rng = random.Random(14)
    for _ in range(300):
        records = _random_records(rng, rng.randrange(12))
        cut = rng.randrange(len(records) + 1)
        book = SealedFrontiers()
        book.observe(records[:cut])
        assert book.frontiers() == _model(records[:cut])
        boundary = book.record(records[cut:])
        assert boundary.kind == RecordKind.FRONTIERS
        assert decode_frontiers(boundary.body) == _model(records) and boundary.count == len(_model(records))
        assert book.frontiers() == _model(records[:cut]), "record(pending) must not observe pending"
        folded: dict[int, int] = {}
        fold(folded, records)
        assert folded == _model(records)


def test_a_boundary_record_carries_a_trimmed_frontier_forward() -> None:
    """What a trim relies on: a book rebuilt from the kept boundary alone says what the
    dropped PROGRESS records said."""
    book = SealedFrontiers()
    book.observe([Record(RecordKind.PROGRESS, relation_id=7, t_lo=3, t_hi=3)])
    kept = book.record()
    reopened = SealedFrontiers()
    reopened.observe([kept])
    assert reopened.frontiers() == {7: 3}
