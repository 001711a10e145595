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


def test_device_ring_header_example_decodes(tmp_path):
    """Both header slots of the device-ring worked example: the fields the text names, and
    the bytes the scenario it describes really writes."""
    from sediment.wal.device.format import SHUTDOWN_CLEAN, SHUTDOWN_RUNNING, RingHeader
    from sediment.wal.device.log import DeviceLog

    slot0 = _example_after("Slot 0, device offset 0 (seq 2")
    slot1 = _example_after("Slot 1, device offset 4096 (seq 3")
    h0, h1 = RingHeader.unpack(slot0), RingHeader.unpack(slot1)
    assert h0 == RingHeader(4096, 1 << 20, 0, 2, (1 << 20) - 8192, SHUTDOWN_RUNNING, 0, 8272)
    assert h1 == RingHeader(4096, 1 << 20, 0, 3, (1 << 20) - 8192, SHUTDOWN_CLEAN, 8272, 8272)
    assert len(slot0) == len(slot1) == 76 and h0.pack() == slot0

    path = tmp_path / "ring"
    log = DeviceLog.open(path, 1 << 20, create=True)
    log.append([rec.Record(rec.RecordKind.UPDATES, relation_id=7, t_lo=10, t_hi=12, count=3, body=b"hello")])
    log.append([rec.Record(rec.RecordKind.PROGRESS, relation_id=7, t_lo=12, t_hi=12)])
    log.finish_segment()
    log.close()
    image = path.read_bytes()
    assert image[:76] == slot0 and image[4096 : 4096 + 76] == slot1


def test_replicated_marker_example_decodes():
    from sediment.engine.deploy import decode_marker, encode_marker

    marker = _example_after("**Worked example.** The marker for `zk://127.0.0.1:2181/sediment`")
    assert decode_marker(marker) == "zk://127.0.0.1:2181/sediment"
    assert encode_marker("zk://127.0.0.1:2181/sediment") == marker


def test_trace_state_example_decodes_with_checksums():
    import json

    from sediment.trace.state import TraceState

    text = DOC.read_text()
    section = text[text.index("### Trace state document"):]
    block = section[section.index("```json") + 7:]
    doc = block[: block.index("```")]
    state = TraceState.decode(doc.encode())
    first = state.batches[0]
    assert (first.crc, first.footer_crc) == (2788437105, 1215470853)
    assert state.batches[2].crc is None  # written before checksums were recorded: still loads
    assert json.loads(state.encode()) == json.loads(doc)


def test_footer_crc_example_covers_the_stated_bytes():
    import crc32c

    from sediment.trace.batch import footer_checksum

    m = re.search(r"last 8 bytes are `([0-9a-f\s]+)`,\s+the\s+footer\s+is\s+0x([0-9a-f]+)\s+=\s+(\d+)\s+bytes\s+long",
                  DOC.read_text())
    assert m is not None, "the footer_crc example moved; update this test"
    trailer = bytes.fromhex(re.sub(r"\s+", "", m.group(1)))
    flen = int(m.group(3))
    assert int(m.group(2), 16) == flen == int.from_bytes(trailer[:4], "little")
    obj = b"PAR1" + bytes(range(256)) * 4 + b"x" * flen + trailer
    assert footer_checksum(obj) == (flen, crc32c.crc32c(obj[-(flen + 8):]))


def test_journal_header_example_decodes():
    from sediment.engine.metadata.journal_format import _scan_journal, journal_header

    header = _example_after("Worked example, the header of a journal following the snapshot of transaction 5")
    assert header == journal_header(5)
    scan = _scan_journal(header, "journal")
    assert scan.base == 5 and scan.corruption is None and not scan.entries


def test_journal_end_example_decodes():
    from sediment.engine.metadata.journal_format import JournalEnd

    raw = _example_after("Worked example, the end record of a journal following snapshot 5")
    assert JournalEnd.decode(raw, "journal.end") == JournalEnd(5, 9, 512)
    assert JournalEnd(5, 9, 512).encode() == raw


def test_owner_marker_example_decodes():
    from sediment.blob.owner import OwnerMarker

    text = DOC.read_text()
    m = re.search(r"Example: `(\{\"created\".*?\})`; this engine's\s+batch nonces start with `([0-9a-f]+)`",
                  text, re.S)
    assert m is not None, "the owner marker example moved; update this test"
    raw = re.sub(r"\s+", "", m.group(1)).encode()
    marker = OwnerMarker.decode(raw, "doc")
    assert (marker.engine_id, marker.data_dir, marker.taken_from) == ("0f1e2d3c4b5a69788796a5b4c3d2e1f0", "/srv/a", None)
    assert marker.tag == m.group(2) and marker.encode() == raw


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
