"""Every error sediment raises, in one place.

Each error says what went wrong, where (relation, file, key, offset) and what to
do about it. All derive from :class:`SedimentError`, so a caller (and the CLI)
can catch one type. A rejected call writes nothing: when one of these is raised
by an API that changes state, the stored state is as it was before the call.
"""

from __future__ import annotations


class SedimentError(Exception):
    """Base class of every error sediment raises on purpose."""


# --- the public API: relations, schemas, updates, frontiers ---------------------------------


class InvalidRelationName(SedimentError, ValueError):
    """The name does not match ``[A-Za-z_][A-Za-z0-9_.-]{0,127}``; names are never paths."""


class UnknownRelation(SedimentError, LookupError):
    """No relation of that name exists (it was never added, or it was dropped)."""


class RelationExists(SedimentError):
    """``add_relation`` with a name that is already in use."""


class SchemaMismatch(SedimentError, ValueError):
    """A schema is unusable (reserved ``time``/``diff`` columns, unsupported type, bad
    spelling), or appended data does not have the relation's columns and types."""


class InvalidUpdates(SedimentError, ValueError):
    """Updates whose ``time`` or ``diff`` column is missing, of the wrong type, null,
    or whose time is negative."""


class TimeAlreadySealed(SedimentError, ValueError):
    """An append at a time <= the relation's sealed frontier: ``close t`` promised no
    further updates at times <= t."""


class FrontierRegression(SedimentError, ValueError):
    """``seal`` or ``set_since`` asked to move a frontier backwards, or ``since`` beyond
    the sealed frontier."""


class AsOfOutOfRange(SedimentError, ValueError):
    """A read ``as_of`` a time outside ``[since, sealed]``: below ``since`` history has
    been consolidated away, above ``sealed`` more updates may still arrive."""


class TransactionError(SedimentError):
    """A write transaction was used after commit or abort, or could not commit (for
    example one of its times was sealed while it was open)."""


class LockConflict(SedimentError):
    """An append's write or read lock names an id written after the client's high-water
    mark: what the client read is stale. Nothing was written; read again and retry.
    ``time`` is the conflicting write's time, ``lock`` the (name, id) pair."""

    def __init__(self, message: str, *, lock: object = None, time: int = -1):
        super().__init__(message)
        self.lock = lock
        self.time = time


class EngineClosed(SedimentError):
    """The engine (or the object being used) was already closed."""


class DataDirLocked(SedimentError):
    """Another process holds the data directory's lock file; only one engine may open
    a data directory at a time."""


# --- the write-ahead log --------------------------------------------------------------------


class WalError(SedimentError):
    """The write-ahead log cannot do what was asked (I/O error, closed, full)."""


class WalCorruption(WalError):
    """Bytes in the log fail their checksum or framing where valid records follow, so it
    is not a torn tail but damage. Carries the file (or device) and byte offset.

    The engine refuses to open; ``sediment verify --repair`` cuts the log at the
    damage after you have decided the loss is acceptable.
    """

    def __init__(self, message: str, *, path: str = "", offset: int = -1, reason: str = ""):
        super().__init__(message)
        self.path = path
        self.offset = offset
        self.reason = reason


class WalMissing(WalCorruption):
    """A file the log must hold is missing or shorter than recorded: a finished segment,
    the active segment, the control file or the log manifest, or the active segment ends
    before the durable end the log recorded. Names the file and the LSN range
    ``[first_lsn, last_lsn]`` it held (-1 when unknown). Never answered by starting a fresh
    log: restore the file, or run ``sediment verify --repair --force`` to accept the loss."""

    def __init__(self, message: str, *, path: str = "", offset: int = -1, reason: str = "",
                 first_lsn: int = -1, last_lsn: int = -1):
        super().__init__(message, path=path, offset=offset, reason=reason)
        self.first_lsn = first_lsn
        self.last_lsn = last_lsn


class RepairRefused(WalError):
    """``verify --repair`` would drop records that other durable state proves were
    acknowledged; nothing was changed. Re-run with ``--force`` to accept the reported loss."""


class WalFull(WalError):
    """The log has no room for the append within the backpressure timeout: the compacter
    has not trimmed enough. Raise ``wal_capacity`` or let compaction catch up."""


# --- metadata -------------------------------------------------------------------------------


class MetadataError(SedimentError):
    """The metadata store failed (I/O, unreachable server)."""


class MetadataMissing(MetadataError):
    """The data directory's metadata is gone while its write-ahead log exists: opening
    would start a fresh, empty catalog over acknowledged data. Restore ``meta/``."""


class MetadataConflict(MetadataError):
    """A compare-and-set found a different version than expected (someone else wrote)."""


class MetadataCorruption(MetadataError):
    """A metadata journal or snapshot fails its checksum or format checks."""


class MetadataUnavailable(MetadataError):
    """The metadata server (ZooKeeper) could not be reached within the timeout."""


class InvalidMetadataRequest(MetadataError, ValueError):
    """A metadata key is malformed (empty segment, leading slash, ``.``/``..``, control
    character, too long) or a value exceeds the size limit; nothing was written."""


# --- blob stores ----------------------------------------------------------------------------


class BlobError(SedimentError):
    """A blob store operation failed after its retries; nothing was half-committed."""


class BlobNotFound(BlobError, LookupError):
    """No object at that key."""


class BlobAlreadyExists(BlobError):
    """``put_if_absent`` found an object at that key already."""


# --- traces and batches ---------------------------------------------------------------------


class TraceError(SedimentError):
    """Trace state or a batch is inconsistent."""


class TraceInvariantViolation(TraceError):
    """A trace's batches do not form one contiguous interval from the start to the sealed
    frontier (gap or overlap), or its frontiers are out of order."""


class BatchCorruption(TraceError):
    """A batch object is missing, unreadable, fails its checksums, or its metadata does
    not match the trace state that references it."""


# --- replication ----------------------------------------------------------------------------


class ReplicationError(SedimentError):
    """The replicated log could not complete an operation."""


class QuorumLost(ReplicationError):
    """Fewer than a write quorum of replicas acknowledged; the append was not acknowledged."""


class SessionFenced(ReplicationError):
    """A newer store session exists: this coordinator has been superseded and must stop."""


class ReplicaUnavailable(ReplicationError):
    """The connection to one storage node failed (refused, closed, timed out). Internal to
    the coordinator, which reconnects or closes the store session; callers see QuorumLost."""


class WireError(ReplicationError):
    """Bytes from a peer are not a valid frame (bad magic, version, CRC or length). The
    connection is dropped: nothing in it after that point can be trusted."""


# --- network coordinator ----------------------------------------------------------------------


class ServerError(SedimentError):
    """The server failed with an error that is not one of sediment's typed errors (a bug or an
    environment problem on the server); the message carries the server's error type and text."""
