"""The worked examples in docs/formats.md decode to what the text says."""

from __future__ import annotations

import pathlib
import re

from sediment.engine.frontiers import SealedFrontiers
from sediment.wal import record as rec

DOC = pathlib.Path(__file__).resolve().parent.parent.parent / "docs" / "formats.md"


_HEX_BYTE = re.compile(r"[0-9a-f]{2}")
_LABELS = {"header", "set", "delete"}


def _block_after(heading: str, fence: str = "```") -> str:
    text = DOC.read_text()
    section = text[text.index(heading):]
    block = section[section.index(fence) + len(fence):]
    return block[: block.index("```")]


def _annotated_bytes(heading: str) -> bytes:
    """The bytes of an annotated hex block: per line, an optional offset (``0010:``) or label
    (``set``), then two-digit hex bytes up to the first word that is not one."""
    out = bytearray()
    for line in _block_after(heading).splitlines():
        tokens = line.split()
        if tokens and (tokens[0].endswith(":") or tokens[0] in _LABELS):
            tokens = tokens[1:]
        for tok in tokens:
            if not _HEX_BYTE.fullmatch(tok):
                break
            out.append(int(tok, 16))
    return bytes(out)


def _example_after(heading: str) -> bytes:
    text = DOC.read_text()
    section = text[text.index(heading):]
    block = section[section.index("```") + 3:]
    block = block[: block.index("```")]
    return bytes.fromhex(re.sub(r"\s+", "", block))


def test_wal_record_example_decodes():
    frame = _example_after("**Worked example.** `close 7`")
    assert len(frame) == rec.HEADER_SIZE == 64
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
    log.set_preamble(SealedFrontiers())  # as the engine does: boundaries carry the sealed frontiers
    log.append([rec.Record(rec.RecordKind.UPDATES, relation_id=7, t_lo=10, t_hi=12, count=3, body=b"hello")])
    log.append([rec.Record(rec.RecordKind.PROGRESS, relation_id=7, t_lo=12, t_hi=12)])
    log.finish_segment()
    log.close()
    image = path.read_bytes()
    assert image[:76] == slot0 and image[4096 : 4096 + 76] == slot1


def test_replicated_marker_example_decodes():
    from sediment.engine.data_dir import decode_marker, encode_marker

    marker = _example_after("**Worked example.** The marker for `zk://127.0.0.1:2181/sediment`")
    assert decode_marker(marker) == "zk://127.0.0.1:2181/sediment"
    assert encode_marker("zk://127.0.0.1:2181/sediment") == marker
    old = bytearray(marker)
    old[8], old[-4:] = 1, bytes.fromhex("95951ddb")  # the version-1 marker the section describes
    assert decode_marker(bytes(old)) == "zk://127.0.0.1:2181/sediment"


def test_trace_state_example_decodes_with_checksums():
    import json

    from sediment.trace.state import TraceState

    text = DOC.read_text()
    section = text[text.index("### Trace state document"):]
    block = section[section.index("```json") + 7:]
    doc = block[: block.index("```")]
    state = TraceState.decode(doc.encode())
    first = state.batches[0]
    assert (first.crc, first.footer_crc) == (932734847, 1881399947)
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
    from sediment.metadata.journal_format import _scan_journal, journal_header

    header = _example_after("Worked example, the header of a journal following the snapshot of transaction 5")
    assert header == journal_header(5)
    scan = _scan_journal(header, "journal")
    assert scan.base == 5 and scan.corruption is None and not scan.entries


def test_journal_end_example_decodes():
    from sediment.metadata.journal_format import JournalEnd

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


def test_journal_entries_example_decodes():
    from sediment.metadata import journal_format as jf

    data = _annotated_bytes("Worked example: after a (version 1) journal header")
    header, set_entry, delete_entry = data[:16], data[16:16 + 37], data[16 + 37:]
    assert header == jf._header(jf.JOURNAL_MAGIC)
    assert set_entry == jf.encode_entry(1, jf.OP_SET, "trace/17", 0, b"hi")
    assert delete_entry == jf.encode_entry(2, jf.OP_DELETE, "trace/17")
    scan = jf._scan_journal(data, "journal")
    assert scan.corruption is None and scan.torn is None and scan.base is None  # version 1: base unknown
    got = [(e.txid, e.op, e.key, e.version, e.value) for e in scan.entries]
    assert got == [(1, jf.OP_SET, "trace/17", 0, b"hi"), (2, jf.OP_DELETE, "trace/17", 0, b"")]


def test_snapshot_example_decodes():
    from sediment.metadata import journal_format as jf
    from sediment.metadata.protocol import Versioned

    data = _annotated_bytes("Example: one key `a` = `b\"xy\"` at version 3, max txid 7")
    assert len(data) == 28 + 33
    assert jf._decode_snapshot(data, "snapshot") == (7, {"a": Versioned(b"xy", 3)})
    assert jf.encode_snapshot(7, {"a": Versioned(b"xy", 3)}) == data


def test_zookeeper_key_node_example_decodes():
    from sediment.metadata.zookeeper import _decode, encode_key_node

    data = _annotated_bytes("Example: key `trace/17` = `b\"hi\"`, created directly")
    write_id = bytes.fromhex("0123456789abcdef")
    assert _decode("/sediment/trace/17", data) == (0, write_id, b"hi")
    assert encode_key_node(b"hi", 0, write_id) == data


def _accounts_batch() -> bytes:
    import pyarrow as pa

    from sediment.trace.batch import BatchDescription, encode_batch

    table = pa.table({"name": pa.array(["alice", "bob", None]), "balance": pa.array([10, 20, 5], pa.int64()),
                      "time": pa.array([3, 4, 4], pa.int64()), "diff": pa.array([1, 1, -1], pa.int64())})
    return encode_batch(table, BatchDescription(relation_id=7, lower=0, upper=5, since=3, rows=3,
                                                wal_first=1024, wal_last=4096))


def test_batch_example_metadata_key_and_schema_decode():
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sediment.trace.batch import BatchDescription, decode_batch, parse_batch_key, read_description

    block = _block_after("Worked example, produced by `encode_batch` for three rows of `accounts`")
    lines = [ln.strip() for ln in block.strip().splitlines() if ln.strip()]
    key = lines[0].removeprefix("key: ")
    listed = dict((k.strip(), v.strip()) for k, v in (ln.split("=", 1) for ln in lines[1:]))
    size = int(re.search(r"the object is ([\d,]+) bytes", DOC.read_text()).group(1).replace(",", ""))

    parsed = parse_batch_key(key)
    assert (parsed.relation_id, parsed.lower, parsed.upper, parsed.nonce) == (7, 0, 5, "9f2c4e1a7b3d5a60")
    data = _accounts_batch()
    assert len(data) == size
    meta = {k.decode(): v.decode() for k, v in pq.ParquetFile(pa.BufferReader(data)).metadata.metadata.items()
            if k.startswith(b"sediment.")}
    assert meta == listed
    desc = read_description(data)
    assert desc == BatchDescription(relation_id=7, lower=0, upper=5, since=3, rows=3, wal_first=1024, wal_last=4096)
    assert decode_batch(data, desc).to_pylist() == [
        {"name": "alice", "balance": 10, "time": 3, "diff": 1}, {"name": "bob", "balance": 20, "time": 4, "diff": 1},
        {"name": None, "balance": 5, "time": 4, "diff": -1}]

    schema_doc = _block_after("Example (a relation `accounts(name string, balance int64)`)")
    shown = str(pq.ParquetFile(pa.BufferReader(data)).schema).splitlines()[1:]  # after the object's repr line
    assert "\n".join(shown).strip() == schema_doc.strip()


def test_trace_state_example_names_the_batch_example_and_its_documented_fields():
    from sediment.trace.batch import checksums, parse_batch_key
    from sediment.trace.state import TraceState

    state = TraceState.decode(_block_after("### Trace state document", "```json").encode())
    assert (state.relation_id, state.since, state.upper, state.wal_through, state.version) == (7, 3, 12, 8192, 17)
    assert [(b.lower, b.upper, b.key is None) for b in state.batches] == [(0, 5, False), (5, 9, True), (9, 12, False)]
    assert [(p.lower, p.upper, p.rows) for p in state.pending] == [(14, 20, 4)]
    first = state.batches[0]
    data = _accounts_batch()
    assert (first.bytes, first.rows, first.wal_first, first.wal_last) == (len(data), 3, 1024, 4096)
    assert (first.crc, first.footer_crc) == checksums(data), "the example's checksums are the batch example's"
    assert all(parse_batch_key(r.key).relation_id == 7 for r in state.batches + state.pending if r.key)


def _xxd_bytes(heading: str) -> tuple[int, bytes]:
    """(first offset, bytes) of an ``xxd``-style block (``00002000: ff 03 ...``)."""
    lines = [ln for ln in _block_after(heading).splitlines() if ln.strip()]
    start = int(lines[0].split(":")[0], 16)
    return start, bytes.fromhex("".join(ln.split(":", 1)[1] for ln in lines))


def test_device_ring_record_examples_decode(tmp_path):
    from sediment.wal.device.log import DeviceLog

    off0, first = _xxd_bytes("The first record, LSN 0, at device offset 8192")
    off1, frontiers = _xxd_bytes("The FRONTIERS record at LSN 8192 (device offset 16384)")
    assert (off0, off1) == (8192, 16384)
    h = rec.decode_header(first)
    assert (h.kind, h.body_len, h.lsn, h.relation_id, h.txn_id, h.t_lo, h.t_hi, h.count) == (
        rec.RecordKind.UPDATES, 5, 0, 7, 0, 10, 12, 3)
    assert rec.body_ok(h, first[64:]) and first[64:] == b"hello"
    h = rec.decode_header(frontiers)
    assert (h.kind, h.body_len, h.lsn, h.count) == (rec.RecordKind.FRONTIERS, 16, 8192, 1)
    assert rec.body_ok(h, frontiers[64:]) and rec.decode_frontiers(frontiers[64:]) == {7: 12}

    path = tmp_path / "ring"
    log = DeviceLog.open(path, 1 << 20, create=True)
    log.set_preamble(SealedFrontiers())  # as the engine does: boundaries carry the sealed frontiers
    log.append([rec.Record(rec.RecordKind.UPDATES, relation_id=7, t_lo=10, t_hi=12, count=3, body=b"hello")])
    log.append([rec.Record(rec.RecordKind.PROGRESS, relation_id=7, t_lo=12, t_hi=12)])
    log.finish_segment()
    log.close()
    image = path.read_bytes()
    assert image[off0:off0 + len(first)] == first and image[off1:off1 + len(frontiers)] == frontiers
    assert not any(image[off0 + len(first):off0 + 4096])  # "the remaining 4027 bytes of the block are zero"


def test_segment_and_index_header_examples_decode():
    import uuid

    from sediment.wal import segment as sg

    data = _annotated_bytes("Data file (`SDSG`, version 1, created, cluster key")
    index = _annotated_bytes("Index file (`SDIX`, the same fields")
    key = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")
    assert len(data) == len(index) == sg.HEADER_SIZE
    assert "`" + sg.segment_name(4096) + "`" in DOC.read_text()  # the name the example gives
    assert sg.parse_header(data) == sg.SegmentHeader(sg.SEG_MAGIC, 1, 1795000000123456789, key, 0, 4096, 0)
    assert sg.parse_header(index) == sg.SegmentHeader(sg.IDX_MAGIC, 1, 1795000000123456789, key, 0, 4096, 1000)
    assert sg.parse_header(data).pack() == data and sg.parse_header(index).pack() == index
    assert sg.parse_header(data[:-1] + bytes([data[-1] ^ 1])) is None  # the CRC is checked
    import dataclasses

    recycled = dataclasses.replace(sg.parse_header(data), flags=sg.FLAG_RECYCLED).pack()
    assert recycled[36:40] == b"\x01\0\0\0" and recycled[:36] == data[:36]  # flags: u32 at offset 36
    assert sg.parse_header(recycled).recycled and not sg.parse_header(data).recycled
    assert sg.END_MARK == bytes(64) and sg.recycled_name(4096) == "0000000000000004096.seg.recycled"


def test_control_file_example_decodes(tmp_path):
    import uuid

    from sediment.wal.control import CONTROL_NAME, ControlFile, PartitionState

    data = _annotated_bytes("**Worked example.** A whole control file (204 bytes)")
    assert len(data) == 204
    (tmp_path / CONTROL_NAME).write_bytes(data)
    ctl = ControlFile.open(str(tmp_path))
    assert (ctl.header.version, ctl.header.created_ns, ctl.header.cluster_key, ctl.header.partitions) == (
        1, 1795000000123456789, uuid.UUID("00112233-4455-6677-8899-aabbccddeeff"), 1)
    assert ctl.partitions == [0]
    assert ctl.read_state(0) == PartitionState(3, 41, 41, 1)


def test_partition_metadata_example_decodes():
    import json

    from sediment.wal.replication.partition_meta import UNRESOLVED, PartitionMeta, ReplicaState, key

    doc = _block_after("Key `store/partition/<id>` (ZooKeeper: `<root>/store/partition/<id>`)", "```json")
    meta = PartitionMeta.decode(doc.encode(), key(0))
    assert (meta.generation, meta.session_id) == (0, 3)
    assert meta.replicas == {"127.0.0.1:7001": ReplicaState(3, UNRESOLVED), "127.0.0.1:7002": ReplicaState(2, 41)}
    assert json.loads(meta.encode()) == json.loads(doc)


def test_s3_metadata_slot_example_decodes():
    from sediment.metadata import s3_format as fmt

    data = _example_after("**Worked example.** Key `trace/17` at version 2 holding")
    slot = fmt.decode_slot(data, "the worked example")
    assert slot == fmt.Slot(fmt.VALUE, 5, 2, bytes.fromhex("00112233445566778899aabbccddeeff"),
                            bytes.fromhex("ffeeddccbbaa99887766554433221100"), b"hi")
    assert fmt.encode_slot(slot) == data
    assert fmt.parse_name("trace/17/00000000000000000005") == ("trace/17", 5)
    text = DOC.read_text()
    hint = re.search(r"Its hint, `prefix/trace/17/hint`: `([0-9a-f \n]+)`", text)
    assert hint is not None
    assert fmt.decode_hint(bytes.fromhex(re.sub(r"\s+", "", hint.group(1)))) == 5
    assert fmt.TOMBSTONE_SIZE == 58 and "A tombstone is exactly 58 bytes" in text


def test_s3_log_object_example_decodes():
    from sediment.wal import s3_format as fmt

    data = _annotated_bytes("**Worked example.** The object at slot 5 of epoch 2")
    head = fmt.decode_header(data)
    assert head is not None and (head.flags, head.epoch, head.slot, head.first_lsn, head.records,
                                 head.start_slot, head.cut_slot, head.token) == (
        0, 2, 5, 42, 1, 0, fmt.NONE, bytes(range(16)))
    offsets, why = fmt.frames(data, head)
    assert why == "" and len(offsets) == 1
    frame = rec.decode_header(data, offsets[0])
    assert (frame.kind, frame.lsn, frame.relation_id, frame.t_lo) == (rec.RecordKind.PROGRESS, 42, 3, 7)
    assert fmt.encode(head, data[fmt.HEADER_SIZE:]) == data


def test_s3_log_plug_and_claim_ahead_example_decodes():
    from sediment.wal import s3_format as fmt
    from sediment.wal.s3_objects import check_follows, effective

    data = _annotated_bytes("**Worked example: a plug and a claim ahead.**")
    plug, claim = fmt.decode_header(data[:fmt.HEADER_SIZE]), fmt.decode_header(data[fmt.HEADER_SIZE:])
    assert plug is not None and claim is not None and len(data) == 2 * fmt.HEADER_SIZE
    assert (plug.flags, plug.epoch, plug.slot, plug.first_lsn, plug.records, plug.start_slot, plug.token) == (
        fmt.PLUG, 5, 4, 3, 0, 0, bytes(range(16)))
    assert (claim.flags, claim.epoch, claim.slot, claim.first_lsn, claim.start_slot, claim.token) == (
        fmt.CLAIM | fmt.AHEAD, 6, 5, 2, 0, bytes(range(16, 32)))
    check_follows(None, 0, plug, claim)  # raises on a rule broken (it names the store only then)
    assert effective(claim, plug).next_lsn == 3
    assert fmt.encode(plug, b"") + fmt.encode(claim, b"") == data


def test_schema_version_header_example_decodes():
    frame = _example_after("written under schema\nversion 2")
    head = rec.decode_header(frame)
    assert head is not None
    assert (head.kind, head.lsn, head.relation_id, head.txn_id, head.t_lo, head.t_hi, head.count, head.body_len,
            head.body_crc, head.schema_version) == (rec.RecordKind.UPDATES, 43, 3, 0, 5, 5, 1, 400, 0x435A3DA2, 2)
    assert "schema_version 2 (the last word)" in DOC.read_text()


def test_schema_history_example_fields():
    import pyarrow as pa

    from sediment.engine.schema_history import SchemaHistory
    from sediment.engine.schema_rules import evolve

    h = SchemaHistory.initial(pa.schema([("id", pa.int32()), ("item", pa.string())]))
    h = evolve("orders", h, widen={"id": pa.int64()}, rename={"item": "product"})
    h = evolve("orders", h, add=[pa.field("qty", pa.int32())], defaults={"qty": 1})
    shown = [(v, [(f.name, int(f.metadata[b"PARQUET:field_id"]), str(f.type)) for f in cols]) for v, cols in h.versions]
    assert shown == [(0, [("id", 1, "int32"), ("item", 2, "string")]),
                     (1, [("id", 1, "int64"), ("product", 2, "string")]),
                     (2, [("id", 1, "int64"), ("product", 2, "string"), ("qty", 3, "int32")])]
    assert h.next_field_id == 4 and {k: v.as_py() for k, v in h.defaults.items()} == {3: 1}
    doc = h.to_json()
    assert sorted(doc) == ["defaults", "next_field_id", "versions"]
    text = DOC.read_text()
    assert "`next_field_id` 4, defaults `{3: 1}`" in text


def test_engine_batch_schema_example_has_field_ids():
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sediment.blob.memory import MemoryBlobStore
    from sediment.engine.schema_history import SchemaHistory
    from sediment.metadata.memory import MemoryMetadataStore
    from sediment.trace.store import TraceStore

    schema = pa.schema([("name", pa.string()), ("balance", pa.int64())])
    store = TraceStore(MemoryMetadataStore(), MemoryBlobStore())
    store.set_layout(7, SchemaHistory.initial(schema).layout())
    table = pa.table({"name": ["alice"], "balance": [10], "time": [3], "diff": [1]})
    ref = store.write(7, table, 0, 5, 3)
    pf = pq.ParquetFile(pa.BufferReader(store.blobs.get(ref.key)))
    shown = str(pf.schema).splitlines()[1:]
    doc = _block_after("The same relation's batch as the engine writes it at\nschema version 0")
    assert "\n".join(shown).strip() == doc.strip()
    assert pf.schema_arrow.metadata[b"sediment.schema_version"] == b"0"


def test_every_flight_message_has_a_worked_example_that_decodes():
    import json

    from sediment.net import messages as msg

    text = DOC.read_text()
    section = text[text.index("### Messages"):]
    section = section[: section.index("\n### ", 1)]
    kinds = {"do_put descriptor": msg.Put, "do_exchange descriptor": msg.Exchange, "do_get ticket": msg.Get,
             "do_action body": msg.Action}
    seen = set()
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("| do_") else []
        if not cells:
            continue
        kind, op, example = kinds[cells[0]], cells[1].strip("`"), json.loads(cells[2].strip("`"))
        op = kind(op)  # an op the protocol knows, of the call the row names
        fields = dict(example)
        if kind is not msg.Action:
            assert fields.pop("op") == op.value
        assert set(fields) <= set(msg.FIELDS[op]), (op, sorted(set(fields) - set(msg.FIELDS[op])))
        assert json.loads(msg.encode(op, **fields)) == example  # the bytes the client sends for it
        seen.add(op)
    assert seen == set(msg.FIELDS), sorted(set(msg.FIELDS) - seen)


def _raw_example() -> tuple[bytes, object]:
    """The raw run of the formats doc's example: the frame's own Parquet file, its description in the footer."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sediment.trace.batch import RAW_VERSION, BatchDescription

    desc = BatchDescription(7, 6, 7, 3, 3, format_version=RAW_VERSION, time=6, diff=1)
    frame = pa.table({"k": pa.array([2, 1, 2], pa.int64()), "v": ["b", "a", "b"]},
                     schema=pa.schema([pa.field("k", pa.int64(), nullable=False), ("v", pa.string())]))
    sink = pa.BufferOutputStream()
    pq.write_table(frame.replace_schema_metadata(desc.to_metadata()), sink)
    return sink.getvalue().to_pybytes(), desc


def test_raw_run_example_footer_and_ref_decode():
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from sediment.trace.batch import read_description
    from sediment.trace.fold import fold
    from sediment.trace.raw import raw_updates
    from sediment.trace.state import BatchRef
    from sediment.trace.store import describe

    block = _block_after("Worked example: a frame `(k int64 not null, v string)` written as it is")
    listed = dict((k.strip(), v.strip()) for k, v in (ln.split("=", 1) for ln in block.strip().splitlines()))
    data, desc = _raw_example()
    meta = {k.decode(): v.decode() for k, v in pq.ParquetFile(pa.BufferReader(data)).metadata.metadata.items()
            if k.startswith(b"sediment.")}
    assert meta == listed
    assert read_description(data) == desc
    run = fold(raw_updates(pq.read_table(pa.BufferReader(data)), desc), ["k", "v"])
    assert [tuple(r.values()) for r in run.to_pylist()] == [(1, "a", 6, 1), (2, "b", 6, 2)]
    assert "It reads as the consolidated run `(1, \"a\", 6, 1)`, `(2, \"b\", 6, 2)`." in DOC.read_text()

    text = DOC.read_text()
    size = int(re.search(r"metadata, ([\d,]+)\s+bytes; a commit", text).group(1).replace(",", ""))
    ref_doc = json.loads(re.search(r"Example:\s+`(\{\"bytes\": \d+.*?\})`", text, re.S).group(1))
    ref = BatchRef(**ref_doc)
    assert ref.raw and (ref.time, ref.diff) == (6, 1) and describe(7, ref) == desc
    assert ref.bytes == size == len(data) and ref.to_json() == ref_doc


def test_group_body_example_decodes():
    import pyarrow as pa

    from sediment.arrow_codec import GROUP_HEADER, decode_updates, encode_updates, join_updates

    head = rec.decode_header(_example_after("two appends joined at LSN 44"))
    assert head is not None
    assert (head.kind, head.lsn, head.relation_id, head.txn_id, head.t_lo, head.t_hi, head.count, head.body_len,
            head.body_crc) == (rec.RecordKind.UPDATES, 44, 3, 0, 5, 6, 2, 540, 0x0730E527)
    _start, body = _xxd_bytes("Its 540-byte body")
    assert rec.body_ok(head, body)
    assert GROUP_HEADER.unpack_from(body) == (b"SDUG", 2, 0, 2)
    schema = pa.schema([("id", pa.int64()), ("time", pa.int64()), ("diff", pa.int64())])
    batch = decode_updates(body, schema)
    assert batch.to_pydict() == {"id": [1, 2], "time": [5, 6], "diff": [1, 1]}
    plain = [encode_updates(pa.record_batch([pa.array([k]), pa.array([t]), pa.array([1])], schema=schema)).to_pybytes()
             for k, t in ((1, 5), (2, 6))]
    assert join_updates(plain) == body
    assert [body[off] for off in (0xFC, 0x104, 0x10C, 0x204, 0x20C, 0x214)] == [1, 5, 1, 2, 6, 1]


def test_s3_cluster_example_decodes():
    from sediment.cluster import s3_layout
    from sediment.cluster.membership import Membership
    from sediment.cluster.s3_membership import S3Membership
    from sediment.metadata.memory import MemoryMetadataStore

    store = MemoryMetadataStore()
    for line in _block_after("## Cluster state on S3").strip().splitlines():
        key, value = line.split(None, 1)
        store.compare_and_set(key, value.encode(), None)
    where = s3_layout.S3ClusterPath.parse("s3://bucket/prod?endpoint=http://127.0.0.1:9000")
    config = s3_layout.read_config(store, where)
    assert (config.partitions, config.session_timeout, config.replicas) == (2, 10.0, [])
    assert s3_layout.member_id(s3_layout.decode("member-seq", store.get("member-seq").value, "member-seq")["last"]) \
        == "m-0000000003"
    view = s3_layout.read_view(store)
    assert view["members"] == {"m-0000000001": "grpc://10.0.0.1:8815", "m-0000000003": "grpc://10.0.0.3:8815"}
    assert view["manager"] == "m-0000000001"
    assert view["assignment"] == {0: ("m-0000000001", 3), 1: ("m-0000000003", 2)}
    assert view["relations"] == {"orders": 1}
    membership: Membership = S3Membership(where)
    membership.config = config
    assert membership.engine_options(1) == {
        "metadata": "s3://bucket/prod/partitions/1?endpoint=http://127.0.0.1:9000",
        "wal": "s3://bucket/prod-blobs/wal/p1", "blob": "s3://bucket/prod-blobs/p1",
        "s3_endpoint": "http://127.0.0.1:9000"}
