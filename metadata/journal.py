"""The embedded metadata store: an edit journal plus a snapshot in one directory.

Modelled on NiFi's write-ahead log. Every change is appended to ``journal`` as a
checksummed entry with a transaction id and fdatasynced before the call returns,
so an acknowledged compare-and-set survives a crash. The whole map is periodically
written to ``snapshot.partial``, fsynced, and renamed over ``snapshot``; only then is
the journal reset, so at every instant the snapshot plus the journal entries with a
larger transaction id hold every acknowledged write.

Recovery (on every open) applies NiFi's four restore rules to ``snapshot`` and
``snapshot.partial``, replays the journal, discards a torn tail (a crash mid-append
leaves a short or zero-filled last entry, which was never acknowledged), and refuses to
open when damage is followed by valid entries (that is lost acknowledged data, not a
crash). An open writes nothing unless recovery must (a torn tail, a .partial, leftovers
of a crashed rename, a missing snapshot or journal, a journal a crash left unclosed), so
a read-only session, or an open the engine refuses, leaves every file as it was. The
journal a clean close left is appended to; only while it still follows the first, empty
snapshot (base 0) is it folded into a new snapshot just before the session's first change,
so from the second writing session on the journal names a snapshot base > 0 and a deleted
snapshot is detected. So a session's first change costs one fdatasync, not a snapshot and a
journal written anew (the journal is still folded whenever it grows past
``checkpoint_bytes``). Byte layouts are in docs/formats.md ("Metadata store formats").
"""

from __future__ import annotations

import contextlib
import os

from sediment._fs import fsync_dir as _fsync_dir
from sediment._fs import lock_file, makedirs_durable, replace_durably, write_all
from sediment.errors import (
    DataDirLocked,
    MetadataCorruption,
    MetadataError,
)
from sediment.metadata.journal_format import (
    DEFAULT_CHECKPOINT_BYTES,
    END_NAME,
    END_NEW_NAME,
    JOURNAL_NAME,
    JOURNAL_NEW_NAME,
    LOCK_NAME,
    OP_DELETE,
    OP_SET,
    PARTIAL_NAME,
    SNAPSHOT_NAME,
    JournalEnd,
    RecoveryReport,
    encode_entry,
    encode_snapshot,
    journal_header,
    restore,
)
from sediment.metadata.memory import MemoryMetadataStore
from sediment.metadata.protocol import Versioned


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _paths(directory: str) -> dict[str, str]:
    return {name: os.path.join(directory, name) for name in (SNAPSHOT_NAME, PARTIAL_NAME, JOURNAL_NAME, END_NAME)}


def _restore_from_disk(directory: str) -> RecoveryReport:
    paths = _paths(directory)
    return restore(_read(paths[SNAPSHOT_NAME]), _read(paths[PARTIAL_NAME]), _read(paths[JOURNAL_NAME]), paths,
                   _read(paths[END_NAME]))


def verify(path: str | os.PathLike[str]) -> list[str]:
    """Every problem in a journal store directory, without modifying anything: exactly what
    an open would refuse (the same :func:`restore`), plus a torn tail open would discard
    (listed with "torn tail" in it: an unacknowledged write). Empty list: all is well."""
    directory = os.fspath(path)
    if not os.path.isdir(directory):
        return [f"{directory}: not a directory"]
    try:
        restored = _restore_from_disk(directory)
    except MetadataCorruption as exc:
        return [str(exc)]
    if restored.torn_tail is None:
        return []
    journal_path = os.path.join(directory, JOURNAL_NAME)
    torn = restored.torn_tail
    return [f"{journal_path}: torn tail at offset {torn.offset} ({torn.length} bytes: "
            f"{torn.reason}); an unacknowledged write, open discards it"]


def load_readonly(path: str | os.PathLike[str]) -> dict[str, Versioned]:
    """The store's contents as an open would restore them, without the lock and without
    writing anything (for ``sediment verify`` and other read-only tools). Raises
    MetadataCorruption where open would."""
    return _restore_from_disk(os.fspath(path)).state


def _checkpoint_reason(report: RecoveryReport, leftovers: bool) -> str | None:
    """Why an open must checkpoint before it serves anything (None: it need not write).
    Each is a state only recovery may leave: the checkpoint replaces it with a snapshot
    and a fresh journal (a torn tail is never appended after; what a crashed session
    left, fdatasynced or not, is durable before it is served)."""
    if report.journal_length == 0:
        return "no journal yet: a new store"
    if report.journal_base is None:
        return "a version-1 journal: rewritten with its base"
    if not report.snapshot_found:
        return "no snapshot: written from the journal"
    if report.partial_action is not None:
        return f"snapshot.partial {report.partial_action}d"
    if report.torn_tail is not None:
        return "a torn tail discarded"
    if leftovers:
        return "leftovers of a crashed rename deleted"
    if report.journal_entries and not report.closed_cleanly:
        return "the journal was not closed cleanly (a crash): its changes made durable in a snapshot"
    return None


class JournalMetadataStore(MemoryMetadataStore):
    """A durable, thread-safe, single-process :class:`~sediment.metadata.protocol.MetadataStore`:
    the memory store's dict, each change journaled (fdatasync) before it is applied."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        checkpoint_bytes: int = DEFAULT_CHECKPOINT_BYTES,
    ) -> None:
        self.directory = os.path.abspath(os.fspath(directory))
        self.journal_path, self.snapshot_path, self.partial_path = (
            os.path.join(self.directory, name) for name in (JOURNAL_NAME, SNAPSHOT_NAME, PARTIAL_NAME))
        self.checkpoint_bytes = checkpoint_bytes
        super().__init__()
        self._journal_fd: int | None = None
        self._journal_size = 0
        self._journal_base = 0
        self._next_txid = 1
        self._failed: str | None = None
        self._fold_due = False  # the journal still follows the first, empty snapshot: checkpoint before a change
        self._end_recorded: JournalEnd | None = None  # what journal.end holds, when it describes this journal
        makedirs_durable(self.directory)
        self._lock_fd = self._take_lock()
        try:
            self.report = self._recover()
        except BaseException:
            self._release()
            raise

    def _take_lock(self) -> int:
        lock_path = os.path.join(self.directory, LOCK_NAME)
        fd = lock_file(lock_path)
        if fd is None:
            with open(lock_path, "rb") as f:
                holder = f.read(32).decode("ascii", "replace").strip() or "unknown"
            raise DataDirLocked(
                f"metadata directory {self.directory} is in use: {lock_path} is locked by "
                f"another store (pid {holder}); close that store or stop that process first"
            )
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
        report = _restore_from_disk(self.directory)
        leftovers = False
        for name in (JOURNAL_NEW_NAME, END_NEW_NAME):  # a reset or a close that crashed before its rename
            stale = os.path.join(self.directory, name)
            if os.path.exists(stale):
                os.unlink(stale)
                _fsync_dir(self.directory)
                leftovers = True
                report.notes.append(f"deleted {stale}: written by a checkpoint or close that crashed before its rename")
        if report.partial_action == "delete":
            os.unlink(self.partial_path)
            _fsync_dir(self.directory)
        elif report.partial_action == "rename":
            os.replace(self.partial_path, self.snapshot_path)
            _fsync_dir(self.directory)
        self._data = report.state
        self._next_txid = report.last_txid + 1
        report.checkpointed = _checkpoint_reason(report, leftovers)
        if report.checkpointed is not None:
            self._checkpoint_locked()
            return report
        assert report.journal_base is not None
        self._journal_fd = os.open(self.journal_path, os.O_WRONLY | os.O_APPEND)
        self._journal_size, self._journal_base = report.journal_length, report.journal_base
        self._fold_due = report.journal_entries > 0 and report.journal_base == 0
        if report.closed_cleanly:
            self._end_recorded = JournalEnd(self._journal_base, self._next_txid - 1, self._journal_size)
        return report

    def _install_journal(self, base: int) -> None:
        """Write a fresh journal (header naming ``base``) aside, fsync it, rename it over
        ``journal`` and fsync the directory: the journal is never missing, empty or torn."""
        new_path = os.path.join(self.directory, JOURNAL_NEW_NAME)
        fd = os.open(new_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        try:
            header = journal_header(base)
            write_all(fd, header)
            os.fsync(fd)
            os.replace(new_path, self.journal_path)
            _fsync_dir(self.directory)
        except BaseException:
            os.close(fd)
            raise
        if self._journal_fd is not None:
            os.close(self._journal_fd)
        self._journal_fd = fd
        self._journal_size = len(header)
        self._journal_base = base

    def _checkpoint_locked(self) -> None:
        base = self._next_txid - 1
        fresh = not os.path.exists(self.journal_path)
        if fresh:  # the first journal exists before the first snapshot, so a snapshot proves one
            self._install_journal(base)
        replace_durably(self.snapshot_path, encode_snapshot(base, self._data), tmp=self.partial_path)
        if not fresh:
            self._install_journal(base)
        self._fold_due = False

    def checkpoint(self) -> None:
        """Write the whole map as a new snapshot and start an empty journal."""
        with self._lock:
            self._check_writable()
            try:
                self._checkpoint_locked()
            except OSError as exc:
                self._failed = f"checkpoint failed: {exc}"
                raise MetadataError(
                    f"metadata checkpoint in {self.directory} failed: {exc}; the store refuses "
                    "further writes, fix the disk and reopen it"
                ) from exc

    def _place(self) -> str:
        return self.directory

    def _check_writable(self) -> None:
        self._check_open()
        if self._failed is not None:
            raise MetadataError(
                f"metadata store {self.directory} refuses writes after an I/O failure "
                f"({self._failed}); fix the disk and reopen the store"
            )

    def _record(self, key: str, version: int | None, value: bytes = b"") -> None:
        if self._fold_due:
            try:
                self._checkpoint_locked()
            except OSError as exc:
                self._failed = f"checkpoint before the session's first change failed: {exc}"
                raise MetadataError(
                    f"metadata checkpoint in {self.directory} failed before a change to {key!r}: {exc}; the "
                    "change was not applied, fix the disk and reopen the store"
                ) from exc
        if version is None:
            self._append(OP_DELETE, key)
        else:
            self._append(OP_SET, key, version, value)

    def _append(self, op: int, key: str, version: int = 0, value: bytes = b"") -> None:
        entry = encode_entry(self._next_txid, op, key, version, value)
        fd = self._journal_fd
        assert fd is not None
        offset = self._journal_size
        try:
            write_all(fd, entry)
            os.fdatasync(fd)
        except OSError as exc:
            self._failed = f"append at {self.journal_path} offset {offset} failed: {exc}"
            with contextlib.suppress(OSError):
                os.ftruncate(fd, offset)
            raise MetadataError(
                f"metadata journal write failed: {self.journal_path} at offset {offset}: {exc}; "
                "the change was not applied, fix the disk and reopen the store"
            ) from exc
        self._journal_size += len(entry)
        self._next_txid += 1

    def _applied(self) -> None:
        if self._journal_size > self.checkpoint_bytes:
            try:
                self._checkpoint_locked()
            except OSError as exc:
                self._failed = f"automatic checkpoint failed: {exc}"

    def _record_end(self) -> None:
        """Record the journal's durable end (``journal.end``: written aside, fsynced, renamed,
        directory fsynced), so a later cut of the journal below it is detected as lost
        acknowledged changes instead of being taken for a crash's torn tail."""
        if self._journal_fd is None or self._failed is not None:
            return
        end = JournalEnd(self._journal_base, self._next_txid - 1, self._journal_size)
        if end == self._end_recorded:  # nothing changed since: the record on disk says it already
            return
        replace_durably(os.path.join(self.directory, END_NAME), end.encode(),
                        tmp=os.path.join(self.directory, END_NEW_NAME))
        self._end_recorded = end

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._record_end()
            except OSError:
                pass  # without the record the store still opens; only a later cut goes undetected
            finally:
                self._release()

    def __enter__(self) -> JournalMetadataStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
