"""Byte layouts and pure recovery logic of the journal metadata store (no I/O here).

The store (metadata/journal.py) reads its three files and hands the bytes to
:func:`restore`, which decides what an open yields: the snapshot to use, the journal
entries to replay, a torn tail to discard, or MetadataCorruption. The same function
serves ``sediment verify``, so verify and open cannot disagree. Layouts are in
docs/formats.md ("Metadata store formats").

What each file proves about the others (so a deleted or stale file is detected, not
read as an emptier catalog): the journal exists from before the first snapshot on, and
its header records the snapshot transaction id it follows (``base``). So a snapshot
without a journal, a journal whose base is newer than the snapshot, and a journal with
base > 0 but no snapshot are all damage.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import crc32c

from sediment.errors import MetadataCorruption
from sediment.metadata.protocol import Versioned
from sediment.metadata.validation import MAX_KEY_BYTES, MAX_VALUE_BYTES

JOURNAL_NAME = "journal"
SNAPSHOT_NAME = "snapshot"
PARTIAL_NAME = "snapshot.partial"
LOCK_NAME = "lock"
JOURNAL_NEW_NAME = "journal.new"  # a fresh journal being written; renamed over ``journal``
END_NAME = "journal.end"  # the journal's durable end, recorded at clean close
END_NEW_NAME = "journal.end.new"

JOURNAL_MAGIC = b"SEDMJRNL"
SNAPSHOT_MAGIC = b"SEDMSNAP"
FORMAT_VERSION = 1  # the snapshot's version (and the journal's before it recorded its base)
JOURNAL_VERSION = 2

_HEADER = struct.Struct("<8sII")  # magic, format version, crc32c(magic + version)
SNAPSHOT_HEADER_SIZE = _HEADER.size
_JOURNAL_HEADER = struct.Struct("<8sIQI")  # magic, version 2, base txid, crc32c(preceding 20 bytes)
HEADER_SIZE = JOURNAL_HEADER_SIZE = _JOURNAL_HEADER.size
_FRAME = struct.Struct("<II")  # payload length, crc32c(length bytes + payload)
_ENTRY_HEAD = struct.Struct("<QBH")  # txid, op, key length
_U64 = struct.Struct("<Q")
_SNAP_FRAME = struct.Struct("<QI")  # body length, crc32c(body)
_SNAP_HEAD = struct.Struct("<QQ")  # max txid, record count
_REC_KEY = struct.Struct("<H")
_REC_VAL = struct.Struct("<QI")  # version, value length
END_MAGIC = b"SEDMJEND"
END_VERSION = 1
_END = struct.Struct("<8sIQQQI")  # magic, version, journal base, last txid, journal length, crc32c(preceding 36)
END_SIZE = _END.size

OP_SET = 1
OP_DELETE = 2
_MIN_PAYLOAD = _ENTRY_HEAD.size + 1
MAX_PAYLOAD = _ENTRY_HEAD.size + MAX_KEY_BYTES + _U64.size + MAX_VALUE_BYTES

DEFAULT_CHECKPOINT_BYTES = 4 << 20


@dataclass(frozen=True)
class TornTail:
    """Bytes at the end of the journal that were discarded: a crash mid-append."""

    offset: int
    length: int
    reason: str


@dataclass(frozen=True)
class _Entry:
    txid: int
    op: int
    key: str
    version: int
    value: bytes
    offset: int
    end: int


@dataclass
class _Scan:
    entries: list[_Entry]
    torn: TornTail | None = None
    corruption: tuple[int, str] | None = None
    base: int | None = None  # the snapshot txid the journal follows (None: a version-1 journal)


def _header(magic: bytes) -> bytes:
    head = magic + struct.pack("<I", FORMAT_VERSION)
    return head + struct.pack("<I", crc32c.crc32c(head))


def _check_header(data: bytes, magic: bytes, path: str) -> str | None:
    """None when ``data`` starts with a valid header for ``magic``, else the problem."""
    if len(data) < SNAPSHOT_HEADER_SIZE:
        return f"{path}: header is {len(data)} bytes, expected {SNAPSHOT_HEADER_SIZE}"
    got_magic, version, crc = _HEADER.unpack_from(data, 0)
    if got_magic != magic:
        return f"{path}: offset 0: magic {got_magic!r} is not {magic!r}; not a sediment metadata file"
    if crc != crc32c.crc32c(data[:12]):
        return f"{path}: offset 0: header CRC32C mismatch"
    if version != FORMAT_VERSION:
        return (
            f"{path}: offset 0: format version {version} is not supported (this build reads "
            f"{FORMAT_VERSION}); use a sediment release that writes version {version}"
        )
    return None


def journal_header(base: int) -> bytes:
    """The 24-byte header of a journal that follows the snapshot at transaction id ``base``."""
    head = JOURNAL_MAGIC + struct.pack("<IQ", JOURNAL_VERSION, base)
    return head + struct.pack("<I", crc32c.crc32c(head))


def _check_journal_header(data: bytes, path: str) -> tuple[int, int | None] | str:
    """(header size, base txid or None for version 1), or the problem."""
    if len(data) < SNAPSHOT_HEADER_SIZE:
        return f"{path}: header is {len(data)} bytes, expected {JOURNAL_HEADER_SIZE}"
    magic, version, _ = _HEADER.unpack_from(data, 0)
    if magic == JOURNAL_MAGIC and version == FORMAT_VERSION:
        problem = _check_header(data, JOURNAL_MAGIC, path)
        return problem if problem is not None else (SNAPSHOT_HEADER_SIZE, None)
    if magic != JOURNAL_MAGIC:
        return f"{path}: offset 0: magic {magic!r} is not {JOURNAL_MAGIC!r}; not a sediment metadata journal"
    if len(data) < JOURNAL_HEADER_SIZE:
        return f"{path}: header is {len(data)} bytes, expected {JOURNAL_HEADER_SIZE}"
    _, version, base, crc = _JOURNAL_HEADER.unpack_from(data, 0)
    if crc != crc32c.crc32c(data[: JOURNAL_HEADER_SIZE - 4]):
        return f"{path}: offset 0: header CRC32C mismatch"
    if version != JOURNAL_VERSION:
        return (f"{path}: offset 0: journal format version {version} is not supported (this build reads "
                f"{FORMAT_VERSION} and {JOURNAL_VERSION}); use a sediment release that writes version {version}")
    return JOURNAL_HEADER_SIZE, base


def encode_entry(txid: int, op: int, key: str, version: int = 0, value: bytes = b"") -> bytes:
    """One framed journal entry (exposed for the format docs and tests)."""
    kb = key.encode("utf-8")
    payload = _ENTRY_HEAD.pack(txid, op, len(kb)) + kb
    if op == OP_SET:
        payload += _U64.pack(version) + value
    length = struct.pack("<I", len(payload))
    return length + struct.pack("<I", crc32c.crc32c(length + payload)) + payload


def _try_entry(data: bytes, off: int) -> tuple[_Entry | None, str]:
    remaining = len(data) - off
    if remaining < _FRAME.size:
        return None, f"short frame header ({remaining} of {_FRAME.size} bytes)"
    length, crc = _FRAME.unpack_from(data, off)
    if length < _MIN_PAYLOAD or length > MAX_PAYLOAD:
        return None, f"implausible entry length {length}"
    end = off + _FRAME.size + length
    if end > len(data):
        return None, f"short entry (needs {length + _FRAME.size} bytes, {remaining} remain)"
    if crc32c.crc32c(data[off : off + 4] + data[off + _FRAME.size : end]) != crc:
        return None, "CRC32C mismatch"
    p = off + _FRAME.size
    txid, op, klen = _ENTRY_HEAD.unpack_from(data, p)
    p += _ENTRY_HEAD.size
    if op not in (OP_SET, OP_DELETE) or p + klen > end:
        return None, f"malformed entry (op {op}, key length {klen})"
    try:
        key = data[p : p + klen].decode("utf-8")
    except UnicodeDecodeError:
        return None, "malformed entry (key is not UTF-8)"
    p += klen
    version, value = 0, b""
    if op == OP_SET:
        if p + _U64.size > end:
            return None, "malformed set entry (no version)"
        (version,) = _U64.unpack_from(data, p)
        value = bytes(data[p + _U64.size : end])
    elif p != end:
        return None, "malformed delete entry (trailing bytes)"
    return _Entry(txid, op, key, version, value, off, end), ""


def _scan_journal(data: bytes, path: str) -> _Scan:
    """Parse every entry; classify the first bad one as a torn tail or as corruption. The
    journal is created whole (written aside, then renamed), so a short, zero or bad
    header is damage, never a crash's tear."""
    scan = _Scan(entries=[])
    checked = _check_journal_header(data, path)
    if isinstance(checked, str):
        scan.corruption = (0, checked + ("; the journal is empty" if not data else ""))
        return scan
    header_size, scan.base = checked
    off = header_size
    while off < len(data):
        entry, reason = _try_entry(data, off)
        if entry is not None:
            scan.entries.append(entry)
            off = entry.end
            continue
        if not any(data[off:]):
            scan.torn = TornTail(off, len(data) - off, f"{reason}; NUL bytes to end of file")
            return scan
        for later in range(off + 1, len(data) - _FRAME.size - _MIN_PAYLOAD + 1):
            follower, _ = _try_entry(data, later)
            if follower is not None:
                scan.corruption = (
                    off,
                    f"{reason}; a valid entry (txid {follower.txid}) follows at offset {later}",
                )
                return scan
        scan.torn = TornTail(off, len(data) - off, reason)
        return scan
    return scan


def _corruption(path: str, offset: int, reason: str) -> MetadataCorruption:
    return MetadataCorruption(
        f"metadata journal damaged: {path} at offset {offset}: {reason}. Acknowledged writes "
        "may be lost; restore the directory from a backup, or move the damaged file aside "
        "after deciding the loss is acceptable"
    )


def encode_snapshot(max_txid: int, records: dict[str, Versioned]) -> bytes:
    """A complete snapshot file (exposed for the format docs and tests)."""
    parts = [_SNAP_HEAD.pack(max_txid, len(records))]
    for key in sorted(records):
        kb = key.encode("utf-8")
        rec = records[key]
        parts.append(_REC_KEY.pack(len(kb)) + kb + _REC_VAL.pack(rec.version, len(rec.value)) + rec.value)
    body = b"".join(parts)
    return _header(SNAPSHOT_MAGIC) + _SNAP_FRAME.pack(len(body), crc32c.crc32c(body)) + body


def _decode_snapshot(data: bytes, path: str) -> tuple[int, dict[str, Versioned]]:
    """(max txid, records); MetadataCorruption naming the file and offset when invalid."""
    problem = _check_header(data, SNAPSHOT_MAGIC, path)
    if problem is not None:
        raise MetadataCorruption(f"metadata snapshot unreadable: {problem}; restore it from a backup")
    off = SNAPSHOT_HEADER_SIZE
    if len(data) < off + _SNAP_FRAME.size:
        raise _snap_error(path, off, "file ends inside the body length/CRC")
    body_len, crc = _SNAP_FRAME.unpack_from(data, off)
    off += _SNAP_FRAME.size
    if len(data) != off + body_len:
        raise _snap_error(path, off, f"body is {len(data) - off} bytes, header says {body_len}")
    body = data[off:]
    if crc32c.crc32c(body) != crc:
        raise _snap_error(path, off, "body CRC32C mismatch")
    try:
        max_txid, count = _SNAP_HEAD.unpack_from(body, 0)
        p = _SNAP_HEAD.size
        records: dict[str, Versioned] = {}
        for _ in range(count):
            (klen,) = _REC_KEY.unpack_from(body, p)
            key = body[p + 2 : p + 2 + klen].decode("utf-8")
            p += 2 + klen
            version, vlen = _REC_VAL.unpack_from(body, p)
            p += _REC_VAL.size
            if p + vlen > len(body):
                raise ValueError("value runs past the end")
            records[key] = Versioned(bytes(body[p : p + vlen]), version)
            p += vlen
        if p != len(body):
            raise ValueError(f"{len(body) - p} trailing bytes after {count} records")
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
        raise _snap_error(path, off + p, f"malformed record: {exc}") from exc
    return max_txid, records


def _snap_error(path: str, offset: int, reason: str) -> MetadataCorruption:
    return MetadataCorruption(
        f"metadata snapshot damaged: {path} at offset {offset}: {reason}; restore it from a backup"
    )


def _replay(
    entries: list[_Entry], snapshot_txid: int, state: dict[str, Versioned], path: str
) -> tuple[int, int, int]:
    """Apply entries newer than the snapshot to ``state``: (last txid, replayed, skipped)."""
    last_txid = snapshot_txid
    previous: int | None = None
    replayed = skipped = 0
    for e in entries:
        if previous is not None and e.txid != previous + 1:
            raise _corruption(path, e.offset, f"transaction id {e.txid} follows {previous}")
        previous = e.txid
        if e.txid <= snapshot_txid:
            skipped += 1
            continue
        if e.txid != last_txid + 1:
            raise _corruption(
                path,
                e.offset,
                f"transaction id {e.txid} but the snapshot ends at {snapshot_txid}: entries are missing",
            )
        current = state.get(e.key)
        if e.op == OP_SET:
            want = 0 if current is None else current.version + 1
            if e.version != want:
                raise _corruption(path, e.offset, f"set of {e.key!r} to version {e.version}, expected {want}")
            state[e.key] = Versioned(e.value, e.version)
        else:
            state.pop(e.key, None)
        last_txid = e.txid
        replayed += 1
    return last_txid, replayed, skipped




@dataclass
class RecoveryReport:
    """What an open restores from the three files' bytes (see :func:`restore`), kept by the
    store for ``sediment verify`` and logs. ``state`` is the restored map, which the store
    then owns and changes."""

    state: dict[str, Versioned] = field(default_factory=dict, repr=False)
    last_txid: int = 0  # the last transaction restored
    snapshot_txid: int = 0
    snapshot_rule: str = ""
    snapshot_keys: int = 0
    partial_action: str | None = None  # "delete" or "rename": what open does to snapshot.partial
    torn_tail: TornTail | None = None
    journal_entries_replayed: int = 0
    journal_entries_skipped: int = 0
    snapshot_found: bool = False  # a snapshot (or a complete .partial) was there to load
    journal_length: int = 0  # the journal's valid length in bytes (0: no journal)
    journal_base: int | None = None  # its header's base (None: no journal, or a version-1 one)
    journal_entries: int = 0  # entries in it, replayed or skipped
    closed_cleanly: bool = False  # journal.end records exactly this journal's end
    checkpointed: str | None = None  # why the open checkpointed (None: it wrote nothing)
    notes: list[str] = field(default_factory=list)

    @property
    def checkpoint_txid(self) -> int:
        return self.last_txid


@dataclass(frozen=True)
class JournalEnd:
    """The journal's durable end as a clean close recorded it (``journal.end``): the journal
    that follows the snapshot ``base`` held every transaction up to ``last_txid`` in its
    first ``length`` bytes. A journal of that generation ending earlier was cut: a crash
    cannot shorten an fdatasynced journal, so the lost entries were acknowledged."""

    base: int
    last_txid: int
    length: int

    def encode(self) -> bytes:
        head = _END.pack(END_MAGIC, END_VERSION, self.base, self.last_txid, self.length, 0)[:-4]
        return head + struct.pack("<I", crc32c.crc32c(head))

    @staticmethod
    def decode(data: bytes, path: str) -> JournalEnd:
        if len(data) != END_SIZE:
            raise MetadataCorruption(f"metadata journal end record damaged: {path} is {len(data)} bytes, expected "
                                     f"{END_SIZE}; restore the directory from a backup (or delete {path} after "
                                     "checking the journal is whole)")
        magic, version, base, last, length, crc = _END.unpack(data)
        if magic != END_MAGIC or crc != crc32c.crc32c(data[:-4]) or version != END_VERSION:
            raise MetadataCorruption(f"metadata journal end record damaged: {path} at offset 0: bad magic, version "
                                     f"or CRC32C; restore the directory from a backup (or delete {path} after "
                                     "checking the journal is whole)")
        return JournalEnd(base, last, length)


def check_end(end: JournalEnd | None, base: int | None, last_txid: int, valid_length: int,
              journal_path: str, end_path: str) -> None:
    """MetadataCorruption when the journal ends below the durable end a clean close recorded
    (pure: the rule open and ``verify`` share). A record of an older journal generation (a
    checkpoint reset the journal since) says nothing about this one."""
    if end is None or base is None or end.base < base:
        return
    if end.base > base:
        raise MetadataCorruption(
            f"metadata journal is stale: {journal_path} follows the snapshot of transaction {base}, but "
            f"{end_path} records a clean close of the journal following transaction {end.base}; changes "
            f"{base + 1}..{end.last_txid} may be lost. Restore the directory from a backup")
    if last_txid < end.last_txid or valid_length < end.length:
        raise MetadataCorruption(
            f"metadata journal cut: {journal_path} ends at offset {valid_length} (transaction {last_txid}), "
            f"but it was closed cleanly at offset {end.length} (transaction {end.last_txid}, recorded in "
            f"{end_path}): acknowledged changes {last_txid + 1}..{end.last_txid} are lost. Restore the "
            "journal from a backup")


def restore(snap: bytes | None, partial: bytes | None, journal: bytes | None, paths: dict[str, str],
            end: bytes | None = None) -> RecoveryReport:
    """The store's contents from the bytes of ``snapshot``, ``snapshot.partial`` and
    ``journal`` (None: file absent), applying NiFi's restore rules and the cross-checks
    between the files, and the journal's recorded durable end (``journal.end``, None:
    absent). ``paths`` maps each file name to its path (for messages). Raises
    MetadataCorruption naming the file when acknowledged writes may be missing."""
    snap_path, partial_path, journal_path = paths[SNAPSHOT_NAME], paths[PARTIAL_NAME], paths[JOURNAL_NAME]
    out = RecoveryReport()
    source = snap_path
    if snap is None and partial is None:
        out.snapshot_rule = "no snapshot: restoring from the journal alone"
    elif snap is not None and partial is None:
        out.snapshot_rule = "snapshot only: restored from it"
    elif snap is not None:
        out.partial_action = "delete"
        out.snapshot_rule = "snapshot and .partial: crash during checkpoint, .partial deleted"
    else:
        assert partial is not None
        try:
            _decode_snapshot(partial, partial_path)
        except MetadataCorruption as exc:
            out.partial_action = "delete"
            out.snapshot_rule = (".partial only and incomplete: first checkpoint crashed, .partial deleted, "
                        "restoring from the journal")
            out.notes.append(str(exc))
        else:
            out.partial_action = "rename"
            snap, source = partial, partial_path
            out.snapshot_rule = ".partial only: renamed to snapshot"
    if snap is not None:
        out.snapshot_txid, out.state = _decode_snapshot(snap, source)
        out.snapshot_keys = len(out.state)
        out.snapshot_found = True
    out.last_txid = out.snapshot_txid
    if journal is None:
        if end is not None:
            raise MetadataCorruption(
                f"metadata journal missing: {journal_path} is gone but {paths.get(END_NAME, END_NAME)} records "
                "its clean close; the changes it held are lost. Restore the journal from a backup")
        if snap is not None:
            raise MetadataCorruption(
                f"metadata journal missing: {journal_path} is gone but the snapshot {source} (transaction "
                f"{out.snapshot_txid}) exists, and a journal is created before the first snapshot; the "
                "changes recorded after that snapshot are lost. Restore the journal from a backup"
            )
        return out
    scan = _scan_journal(journal, journal_path)
    if scan.corruption is not None:
        raise _corruption(journal_path, *scan.corruption)
    if scan.base is not None:
        if snap is None and scan.base > 0:
            raise MetadataCorruption(
                f"metadata snapshot missing: {snap_path} is gone but {journal_path} follows the snapshot of "
                f"transaction {scan.base}; every change up to it is lost. Restore the snapshot from a backup"
            )
        if scan.base > out.snapshot_txid:
            raise MetadataCorruption(
                f"metadata snapshot is stale: {source} ends at transaction {out.snapshot_txid} but "
                f"{journal_path} follows the snapshot of transaction {scan.base}; changes "
                f"{out.snapshot_txid + 1}..{scan.base} are lost. Restore the matching snapshot from a backup"
            )
        if scan.entries and scan.entries[0].txid != scan.base + 1:
            raise _corruption(journal_path, scan.entries[0].offset,
                              f"first entry has transaction id {scan.entries[0].txid} but the header says the "
                              f"journal follows {scan.base}: entries are missing")
    out.last_txid, out.journal_entries_replayed, out.journal_entries_skipped = _replay(scan.entries, out.snapshot_txid, out.state, journal_path)
    out.journal_length = scan.torn.offset if scan.torn is not None else len(journal)
    out.journal_base, out.journal_entries = scan.base, len(scan.entries)
    if end is not None:
        end_path = paths.get(END_NAME, END_NAME)
        recorded = JournalEnd.decode(end, end_path)
        check_end(recorded, scan.base, out.last_txid, out.journal_length, journal_path, end_path)
        out.closed_cleanly = (scan.torn is None and scan.base is not None
                             and recorded == JournalEnd(scan.base, out.last_txid, len(journal)))
    out.torn_tail = scan.torn
    if scan.torn is not None:
        out.notes.append(f"discarded torn tail of {journal_path} at offset {scan.torn.offset} "
                         f"({scan.torn.length} bytes): {scan.torn.reason}")
    return out
