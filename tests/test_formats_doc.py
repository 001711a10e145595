"""The worked examples in docs/formats.md decode to what the text says."""

from __future__ import annotations

import pathlib
import re

from sediment.wal import record as rec

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "formats.md"


def _example_after(heading: str) -> bytes:
    text = DOC.read_text()
    section = text[text.index(heading):]
    block = section[section.index("```") + 3:]
    block = block[: block.index("```")]
    return bytes.fromhex(re.sub(r"\s+", "", block))


def test_wal_record_example_decodes():
    frame = _example_after("**Worked example.** `close 7`")
    assert len(frame) == rec.HEADER_SIZE
    head = rec.decode_header(frame)
    assert head is not None
    assert (head.kind, head.lsn, head.relation_id, head.txn_id, head.t_lo, head.t_hi, head.body_len) == (
        rec.RecordKind.PROGRESS, 42, 3, 0, 7, 7, 0)
    assert rec.encode(rec.Record(rec.RecordKind.PROGRESS, relation_id=3, t_lo=7, t_hi=7), 42) == frame


def test_commit_body_example_lists_the_further_transactions():
    text = DOC.read_text()
    m = re.search(r"the\s+body `([0-9a-f ]+)` of COMMIT\(txn `(0x[0-9a-f]+)`\) commits\s+"
                  r"`(0x[0-9a-f]+)`, `(0x[0-9a-f]+)` and `(0x[0-9a-f]+)`", text)
    assert m is not None, "the COMMIT body example moved; update this test"
    body = bytes.fromhex(m.group(1).replace(" ", ""))
    commit = rec.Record(rec.RecordKind.COMMIT, txn_id=int(m.group(2), 16), body=body)
    assert rec.committed_txn_ids(commit) == [int(g, 16) for g in m.groups()[2:]]
    assert rec.encode_txn_ids([int(g, 16) for g in m.groups()[3:]]) == body


def test_log_manifest_example_decodes():
    import uuid

    from sediment.wal import manifest as mf

    data = _example_after("**Worked example.** Cluster key `00112233")
    m = mf.unpack(data, "example")
    assert (m.cluster_key, m.partition, m.start_lsn, m.active_first, m.generation) == (
        uuid.UUID("00112233-4455-6677-8899-aabbccddeeff"), 0, 6, 17, 4)
    assert m.finished == [mf.FinishedSegment(6, 16, 88458)]
    assert (m.durable_end, m.end_sequence) == (20, 3)
    assert mf.pack(m) == data
