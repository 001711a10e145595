"""The embedded metadata store: an edit journal plus a snapshot in one directory.

Modelled on NiFi's write-ahead log. Every change is appended to ``journal`` as a
checksummed entry with a transaction id and fdatasynced before the call returns,
so an acknowledged compare-and-set survives a crash. The whole map is periodically
written to ``snapshot.partial``, fsynced, and renamed over ``snapshot``; only then is
the journal reset, so at every instant the snapshot plus the journal entries with a
larger transaction id hold every acknowledged write.

Recovery (on every open) applies NiFi's four restore rules to ``snapshot`` and
``snapshot.partial``, replays the journal, discards a torn tail (a crash mid-append
leaves a short or zero-filled last entry, which was never acknowledged), refuses to
open when damage is followed by valid entries (that is lost acknowledged data, not a
crash), and then checkpoints before accepting writes so new entries are never
appended after a torn tail. Byte layouts are in docs/formats.md ("Metadata store formats").
"""

from __future__ import annotations

import fcntl
import os
import struct
import threading
from dataclasses import dataclass, field

import crc32c

from sediment._fs import fsync_dir as _fsync_dir
from sediment._fs import makedirs_durable
from sediment.engine.metadata import Versioned
from sediment.engine.metadata_keys import (
    MAX_KEY_BYTES,
    MAX_VALUE_BYTES,
    validate_expected,
    validate_key,
    validate_prefix,
    validate_value,
)
from sediment.errors import (
    DataDirLocked,
    EngineClosed,
    MetadataConflict,
    MetadataCorruption,
    MetadataError,
)

JOURNAL_NAME = "journal"
SNAPSHOT_NAME = "snapshot"
PARTIAL_NAME = "snapshot.partial"
LOCK_NAME = "lock"

JOURNAL_MAGIC = b"SEDMJRNL"
SNAPSHOT_MAGIC = b"SEDMSNAP"
FORMAT_VERSION = 1

_HEADER = struct.Struct("<8sII")  # magic, format version, crc32c(magic + version)
HEADER_SIZE = _HEADER.size
_FRAME = struct.Struct("<II")  # payload length, crc32c(length bytes + payload)
_ENTRY_HEAD = struct.Struct("<QBH")  # txid, op, key length
_U64 = struct.Struct("<Q")
_SNAP_FRAME = struct.Struct("<QI")  # body length, crc32c(body)
_SNAP_HEAD = struct.Struct("<QQ")  # max txid, record count
_REC_KEY = struct.Struct("<H")
_REC_VAL = struct.Struct("<QI")  # version, value length

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


@dataclass
class RecoveryReport:
    """What opening the store found, for ``sediment verify`` and logs."""

    directory: str
    snapshot_rule: str = ""
    snapshot_txid: int = 0
    snapshot_keys: int = 0
    journal_entries_replayed: int = 0
    journal_entries_skipped: int = 0
    torn_tail: TornTail | None = None
    checkpoint_txid: int = 0
    notes: list[str] = field(default_factory=list)


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


def _header(magic: bytes) -> bytes:
    head = magic + struct.pack("<I", FORMAT_VERSION)
    return head + struct.pack("<I", crc32c.crc32c(head))


def _check_header(data: bytes, magic: bytes, path: str) -> str | None:
    """None when ``data`` starts with a valid header for ``magic``, else the problem."""
    if len(data) < HEADER_SIZE:
        return f"{path}: header is {len(data)} bytes, expected {HEADER_SIZE}"
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
    """Parse every entry; classify the first bad one as a torn tail or as corruption."""
    scan = _Scan(entries=[])
    if not data:
        return scan
    problem = _check_header(data, JOURNAL_MAGIC, path)
    if problem is not None:
        if len(data) < HEADER_SIZE or not any(data):
            scan.torn = TornTail(0, len(data), "journal header torn: " + problem)
        else:
            scan.corruption = (0, problem)
        return scan
    off = HEADER_SIZE
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
    off = HEADER_SIZE
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


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def verify(path: str | os.PathLike[str]) -> list[str]:
    """Every problem in a journal store directory, without modifying anything.

    Checks the snapshot (or the ``.partial`` the restore rules would use), every
    journal checksum and the transaction id sequence. A torn tail is listed too:
    open would discard it (it was never acknowledged). Empty list: all is well.
    """
    directory = os.fspath(path)
    problems: list[str] = []
    if not os.path.isdir(directory):
        return [f"{directory}: not a directory"]
    snap_path = os.path.join(directory, SNAPSHOT_NAME)
    partial_path = os.path.join(directory, PARTIAL_NAME)
    journal_path = os.path.join(directory, JOURNAL_NAME)
    snap = _read(snap_path)
    partial = _read(partial_path)
    snapshot_txid, state = 0, {}
    source = snap_path if snap is not None else partial_path
    data = snap if snap is not None else partial
    if data is not None:
        try:
            snapshot_txid, state = _decode_snapshot(data, source)
        except MetadataCorruption as exc:
            if snap is not None:
                problems.append(str(exc))
            else:
                problems.append(f"{partial_path}: incomplete snapshot, open would discard it ({exc})")
    journal = _read(journal_path)
    if journal is not None:
        scan = _scan_journal(journal, journal_path)
        if scan.corruption is not None:
            problems.append(str(_corruption(journal_path, *scan.corruption)))
        else:
            try:
                _replay(scan.entries, snapshot_txid, dict(state), journal_path)
            except MetadataCorruption as exc:
                problems.append(str(exc))
            if scan.torn is not None:
                problems.append(
                    f"{journal_path}: torn tail at offset {scan.torn.offset} ({scan.torn.length} bytes: "
                    f"{scan.torn.reason}); an unacknowledged write, open discards it"
                )
    return problems


def load_readonly(path: str | os.PathLike[str]) -> dict[str, Versioned]:
    """The store's contents as an open would restore them, without the lock and without
    writing anything (for ``sediment verify`` and other read-only tools). Raises
    MetadataCorruption where open would."""
    directory = os.fspath(path)
    snap = _read(os.path.join(directory, SNAPSHOT_NAME))
    source = SNAPSHOT_NAME if snap is not None else PARTIAL_NAME
    data = snap if snap is not None else _read(os.path.join(directory, PARTIAL_NAME))
    txid, state = _decode_snapshot(data, os.path.join(directory, source)) if data is not None else (0, {})
    journal_path = os.path.join(directory, JOURNAL_NAME)
    journal = _read(journal_path)
    if journal is not None:
        scan = _scan_journal(journal, journal_path)
        if scan.corruption is not None:
            raise _corruption(journal_path, *scan.corruption)
        state = dict(state)
        _replay(scan.entries, txid, state, journal_path)
    return state


class JournalMetadataStore:
    """A durable, thread-safe, single-process :class:`~sediment.engine.metadata.MetadataStore`."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        checkpoint_bytes: int = DEFAULT_CHECKPOINT_BYTES,
    ) -> None:
        self.directory = os.path.abspath(os.fspath(directory))
        self.checkpoint_bytes = checkpoint_bytes
        self._mutex = threading.Lock()
        self._state: dict[str, Versioned] = {}
        self._journal_fd: int | None = None
        self._journal_size = 0
        self._next_txid = 1
        self._failed: str | None = None
        self._closed = False
        makedirs_durable(self.directory)
        self._lock_fd = self._take_lock()
        try:
            self.report = self._recover()
        except BaseException:
            self._release()
            raise

    @property
    def journal_path(self) -> str:
        return os.path.join(self.directory, JOURNAL_NAME)

    @property
    def snapshot_path(self) -> str:
        return os.path.join(self.directory, SNAPSHOT_NAME)

    @property
    def partial_path(self) -> str:
        return os.path.join(self.directory, PARTIAL_NAME)

    def _take_lock(self) -> int:
        lock_path = os.path.join(self.directory, LOCK_NAME)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise DataDirLocked(
                f"metadata directory {self.directory} is in use: {lock_path} is locked by "
                f"another store (pid {holder}); close that store or stop that process first"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def _release(self) -> None:
        if self._journal_fd is not None:
            os.close(self._journal_fd)
            self._journal_fd = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _recover(self) -> RecoveryReport:
        report = RecoveryReport(directory=self.directory)
        snap = _read(self.snapshot_path)
        partial_exists = os.path.exists(self.partial_path)
        snapshot_txid = 0
        if snap is None and not partial_exists:
            report.snapshot_rule = "no snapshot: restoring from the journal alone"
        elif snap is not None and not partial_exists:
            report.snapshot_rule = "snapshot only: restored from it"
        elif snap is not None:
            os.unlink(self.partial_path)
            _fsync_dir(self.directory)
            report.snapshot_rule = "snapshot and .partial: crash during checkpoint, .partial deleted"
        else:
            partial = _read(self.partial_path) or b""
            try:
                _decode_snapshot(partial, self.partial_path)
            except MetadataCorruption as exc:
                os.unlink(self.partial_path)
                _fsync_dir(self.directory)
                report.snapshot_rule = (
                    ".partial only and incomplete: first checkpoint crashed, .partial deleted, "
                    "restoring from the journal"
                )
                report.notes.append(str(exc))
            else:
                os.replace(self.partial_path, self.snapshot_path)
                _fsync_dir(self.directory)
                snap = partial
                report.snapshot_rule = ".partial only: renamed to snapshot"
        if snap is not None:
            snapshot_txid, self._state = _decode_snapshot(snap, self.snapshot_path)
        report.snapshot_txid = snapshot_txid
        report.snapshot_keys = len(self._state)

        journal = _read(self.journal_path)
        last_txid = snapshot_txid
        if journal is not None:
            scan = _scan_journal(journal, self.journal_path)
            if scan.corruption is not None:
                raise _corruption(self.journal_path, *scan.corruption)
            last_txid, report.journal_entries_replayed, report.journal_entries_skipped = _replay(
                scan.entries, snapshot_txid, self._state, self.journal_path
            )
            report.torn_tail = scan.torn
            if scan.torn is not None:
                report.notes.append(
                    f"discarded torn tail of {self.journal_path} at offset {scan.torn.offset} "
                    f"({scan.torn.length} bytes): {scan.torn.reason}"
                )
        self._next_txid = last_txid + 1
        self._checkpoint_locked()
        report.checkpoint_txid = last_txid
        return report

    def _checkpoint_locked(self) -> None:
        data = encode_snapshot(self._next_txid - 1, self._state)
        fd = os.open(self.partial_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(self.partial_path, self.snapshot_path)
        _fsync_dir(self.directory)
        if self._journal_fd is not None:
            os.close(self._journal_fd)
            self._journal_fd = None
        fd = os.open(self.journal_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        self._journal_fd = fd
        header = _header(JOURNAL_MAGIC)
        _write_all(fd, header)
        os.fsync(fd)
        _fsync_dir(self.directory)
        self._journal_size = len(header)

    def checkpoint(self) -> None:
        """Write the whole map as a new snapshot and start an empty journal."""
        with self._mutex:
            self._check_writable()
            try:
                self._checkpoint_locked()
            except OSError as exc:
                self._failed = f"checkpoint failed: {exc}"
                raise MetadataError(
                    f"metadata checkpoint in {self.directory} failed: {exc}; the store refuses "
                    "further writes, fix the disk and reopen it"
                ) from exc

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosed(f"metadata store {self.directory} was closed; open it again")

    def _check_writable(self) -> None:
        self._check_open()
        if self._failed is not None:
            raise MetadataError(
                f"metadata store {self.directory} refuses writes after an I/O failure "
                f"({self._failed}); fix the disk and reopen the store"
            )

    def _append(self, op: int, key: str, version: int = 0, value: bytes = b"") -> None:
        entry = encode_entry(self._next_txid, op, key, version, value)
        fd = self._journal_fd
        assert fd is not None
        offset = self._journal_size
        try:
            _write_all(fd, entry)
            os.fdatasync(fd)
        except OSError as exc:
            self._failed = f"append at {self.journal_path} offset {offset} failed: {exc}"
            try:
                os.ftruncate(fd, offset)
            except OSError:
                pass
            raise MetadataError(
                f"metadata journal write failed: {self.journal_path} at offset {offset}: {exc}; "
                "the change was not applied, fix the disk and reopen the store"
            ) from exc
        self._journal_size += len(entry)
        self._next_txid += 1

    def _maybe_checkpoint(self) -> None:
        if self._journal_size > self.checkpoint_bytes:
            try:
                self._checkpoint_locked()
            except OSError as exc:
                self._failed = f"automatic checkpoint failed: {exc}"

    def get(self, key: str) -> Versioned | None:
        validate_key(key)
        with self._mutex:
            self._check_open()
            return self._state.get(key)

    def compare_and_set(self, key: str, value: bytes, expected_version: int | None) -> int:
        validate_key(key)
        validate_expected(key, expected_version)
        value = validate_value(key, value)
        with self._mutex:
            self._check_writable()
            current = self._state.get(key)
            if expected_version is None:
                if current is not None:
                    raise MetadataConflict(
                        f"metadata key {key!r} already exists at version {current.version} "
                        f"in {self.directory}; re-read it and retry with that version"
                    )
                version = 0
            else:
                if current is None or current.version != expected_version:
                    found = "absent" if current is None else f"at version {current.version}"
                    raise MetadataConflict(
                        f"metadata key {key!r} in {self.directory} is {found}, expected version "
                        f"{expected_version}; re-read it and retry"
                    )
                version = expected_version + 1
            self._append(OP_SET, key, version, value)
            self._state[key] = Versioned(value, version)
            self._maybe_checkpoint()
            return version

    def delete(self, key: str, expected_version: int | None = None) -> None:
        validate_key(key)
        validate_expected(key, expected_version)
        with self._mutex:
            self._check_writable()
            current = self._state.get(key)
            if expected_version is not None and (current is None or current.version != expected_version):
                found = "absent" if current is None else f"at version {current.version}"
                raise MetadataConflict(
                    f"cannot delete metadata key {key!r} in {self.directory}: it is {found}, "
                    f"expected version {expected_version}; re-read it and retry"
                )
            if current is None:
                return
            self._append(OP_DELETE, key)
            del self._state[key]
            self._maybe_checkpoint()

    def list(self, prefix: str) -> list[str]:
        validate_prefix(prefix)
        with self._mutex:
            self._check_open()
            return sorted(k for k in self._state if k.startswith(prefix))

    def close(self) -> None:
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            self._release()

    def __enter__(self) -> JournalMetadataStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
