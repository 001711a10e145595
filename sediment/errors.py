"""Every error sediment raises, in one place.

Each error says what went wrong, where (relation, file, key, offset) and what to
do about it. All derive from :class:`SedimentError`, so a caller (and the CLI)
can catch one type. A rejected call writes nothing: when one of these is raised
by an API that changes state, the stored state is as it was before the call.
"""

from __future__ import annotations


class SedimentError(Exception):
    """Base class of every error sediment raises on purpose. Keyword arguments set the
    details a subclass declares as class attributes (their defaults), so that every error
    carries its facts (a path, an offset, a partition) without an ``__init__`` of its own."""

    def __init__(self, *args: object, **details: object) -> None:
        super().__init__(*args)
        for name, value in details.items():
            if name not in _declared(type(self)):
                raise TypeError(f"{type(self).__name__} carries no detail {name!r}")
            setattr(self, name, value)


def _declared(cls: type) -> set[str]:
    """The details ``cls`` and its bases declare (annotated class attributes)."""
    return {name for c in cls.__mro__ for name in vars(c).get("__annotations__", {})}


class NothingWritten(SedimentError):
    """The call was refused before anything reached the log: nothing was written, and
    retrying the same call writes it at most once. (Errors of this kind say so by
    deriving from this class; a write error that does not is :class:`OutcomeUnknown`
    or leaves the engine unusable.)"""


class OutcomeUnknown(SedimentError):
    """The write may or may not have been written; read back or retry idempotently.

    The log had the records in flight when the error struck (a lost quorum, a newer
    coordinator, a timeout, the log stopping): recovery keeps whatever a quorum holds,
    so a later read may show them. Count such a write as neither failed nor done: read
    back (for example by a key or an id carried in the rows) before writing it again,
    or make the write idempotent."""


# --- the public API: relations, schemas, updates, frontiers ---------------------------------


class InvalidRelationName(NothingWritten, ValueError):
    """The name does not match ``[A-Za-z_][A-Za-z0-9_.-]{0,127}``; names are never paths."""


class UnknownRelation(NothingWritten, LookupError):
    """No relation of that name exists (it was never added, or it was dropped)."""


class RelationExists(NothingWritten):
    """``add_relation`` with a name that is already in use."""


class SchemaMismatch(NothingWritten, ValueError):
    """A schema is unusable (reserved ``time``/``diff`` columns, unsupported type, bad
    spelling), or appended data does not have the relation's columns and types."""


class SchemaChangeRefused(SchemaMismatch):
    """``alter_relation`` asked for a change the rules refuse (narrowing, a change of kind, a
    clash of names, dropping the last column, an added column that is neither nullable nor
    given a default). ``column`` and ``rule`` name what was refused; nothing was changed."""

    column: str = ""
    rule: str = ""


class SchemaVersionMoved(NothingWritten):
    """An alter sent from schema version ``base`` (a cluster client's, cluster/alter_once.py)
    found that another alter took version ``base + 1``; nothing was changed: read the
    relation's schema version and send the alter from it (the cluster client does)."""


class InvalidUpdates(NothingWritten, ValueError):
    """Updates whose ``time`` or ``diff`` column is missing, of the wrong type, null,
    or whose time is negative."""


class InvalidArgument(NothingWritten, ValueError):
    """An argument of a public call (or an option of ``sediment.open``) has the wrong type or
    is out of range; the message names it and what is allowed. Nothing was written."""


class InvalidTime(InvalidArgument):
    """A time argument (``seal``, ``set_since``, ``as_of``, ``from_t``) is not an integer in
    ``[0, 2**63)``: bools, floats, strings and None are refused, not converted."""


class DiffOverflow(SedimentError, OverflowError):
    """The diffs of one row (at one time) sum to a value outside int64: the sum is refused
    rather than wrapped. ``relation`` and ``row`` say which (when known); the updates stay
    stored, so appending a compensating diff for that row repairs it."""

    relation: str = ""
    row: object = None


class CompactionFailed(SedimentError):
    """``Engine.compact`` could not compact some relations. The others were compacted and
    the log trimmed below what the failed ones still need; they keep their WAL records and
    are retried on every later pass. ``failures`` maps relation name to the error text."""

    failures: dict[str, str] = {}


class BulkSealUnknown(SedimentError):
    """A bulk load with ``seal`` committed (an earlier attempt did), but its last time is not
    known (the coordinator that committed it did not keep it): nothing was sealed; seal the
    relation at the load's last time yourself."""


class TimeAlreadySealed(NothingWritten, ValueError):
    """An append at a time <= the relation's sealed frontier: ``close t`` promised no
    further updates at times <= t."""


class StagedFileInvalid(NothingWritten, ValueError):
    """A file staged for a bulk load cannot become a run (unreadable, null times or diffs,
    negative times); the load was not committed and its staged files are kept for abort."""


class FrontierRegression(NothingWritten, ValueError):
    """``seal`` or ``set_since`` asked to move a frontier backwards, or ``since`` beyond
    the sealed frontier."""


class AsOfOutOfRange(SedimentError, ValueError):
    """A read ``as_of`` a time outside ``[since, sealed]``: below ``since`` history has
    been consolidated away, above ``sealed`` more updates may still arrive."""


class TransactionError(SedimentError):
    """A write transaction was used after commit or abort, or could not commit (for
    example one of its times was sealed while it was open)."""


class LockConflict(NothingWritten):
    """An append's write or read lock names an id written after the client's high-water
    mark: what the client read is stale. Nothing was written; read again and retry.
    ``time`` is the conflicting write's time, ``lock`` the (name, id) pair."""

    lock: object = None
    time: int = -1


class EngineClosed(SedimentError):
    """The engine (or the object being used) was already closed."""


class FeedOverrun(SedimentError):
    """A subscriber fell more than its ``max_lag`` events behind its feed and was dropped,
    so that the writer and the WAL never wait for it. Catch up from the trace: keep your
    state as of the last progress time delivered, drop the updates received since, and
    subscribe again with that ``as_of`` and ``resume=True``."""


class DataDirLocked(SedimentError):
    """Another process holds the data directory's lock file; only one engine may open
    a data directory at a time."""


class NotADataDir(NothingWritten, LookupError):
    """A command that works on an existing engine was given a directory that does not exist
    or holds no engine (none of ``meta/``, ``wal/``, ``REPLICATED``); nothing was created in it."""


# --- the write-ahead log --------------------------------------------------------------------


class WalError(SedimentError):
    """The write-ahead log cannot do what was asked (I/O error, closed, full)."""


class WalCorruption(WalError):
    """Bytes in the log fail their checksum or framing where valid records follow, so it
    is not a torn tail but damage. Carries the file (or device) and byte offset.

    The engine refuses to open; ``sediment verify --repair`` cuts the log at the
    damage after you have decided the loss is acceptable.
    """

    path: str = ""
    offset: int = -1
    reason: str = ""


class EngineFailed(WalError):
    """A write whose outcome is unknown (QuorumLost, a failed sync: the log may hold records
    this engine never acknowledged) left the engine's view possibly behind its log, so the
    engine refuses every read and write (and stops compacting) rather than answer from a
    state a reopen could contradict. Close the engine and open it again: the open's
    recovery settles the log, and the reopened engine shows what it kept."""


class WalMissing(WalCorruption):
    """A file the log must hold is missing or shorter than recorded: a finished segment,
    the active segment, the control file or the log manifest, or the active segment ends
    before the durable end the log recorded; or a device ring is missing or its header
    area blank. Names the file and the LSN range
    ``[first_lsn, last_lsn]`` it held (-1 when unknown). Never answered by starting a fresh
    log: restore the file, or run ``sediment verify --repair --force`` to accept the loss."""

    first_lsn: int = -1
    last_lsn: int = -1


class RepairRefused(WalError):
    """``verify --repair`` would drop records that other durable state proves were
    acknowledged; nothing was changed. Re-run with ``--force`` to accept the reported loss."""


class WalFull(WalError, NothingWritten):
    """The log has no room for the append within the backpressure timeout: the compacter
    has not trimmed enough. Raise ``wal_capacity`` or let compaction catch up."""


class WalBacklogFull(WalError, NothingWritten):
    """Retryable: the WAL holds ``max_wal_backlog`` bytes of updates the compacter has not
    yet taken out of it, and it made no room for the append within ``wal_backlog_timeout``.
    Nothing was written; retry later (compaction catches up), look at
    ``Engine.compaction_errors()`` and long open transactions, or raise the bound."""

    retryable = True
    backlog: int = 0
    bound: int | None = None


class WalExists(WalError):
    """Creating a log was asked for where a log holding records already exists; creating
    would discard them. Open it without ``create``."""

    path: str = ""


class WalShortened(WalCorruption):
    """The log's valid records end before the durable end it recorded (at a clean close or a
    checkpoint): acknowledged records in ``[lost_from, lost_to)`` (LSNs) are missing or
    damaged. Not a torn tail; restore the log, or cut it with ``--repair`` to accept the loss."""

    lost_from: int = -1
    lost_to: int = -1


class WalFenced(WalError, NothingWritten):
    """A log on S3 was taken over: a newer writer (another coordinator, or a later open)
    holds the slot this append was to fill, so this append was not written, and this log
    writes nothing more. Stop this process; the coordinator that took over serves the data."""


class WalTakenOverInFlight(WalError, OutcomeUnknown):
    """A log on S3 was taken over while this append's PUT was being resent, and the slot it
    went to is gone (trimmed by the new writer): it may have landed before the takeover, and
    then the new writer's log holds it. Read back through the coordinator that took over."""


class WalOutcomeUnknown(WalError, OutcomeUnknown):
    """A log on S3 could not learn whether a PUT landed (its answer was lost and reading the
    slot back failed too): the append may be in the log. The log writes nothing more; reopen
    the engine, whose recovery reads the log as it is, and read back before writing again."""


# --- metadata -------------------------------------------------------------------------------


class MetadataError(SedimentError):
    """The metadata store failed (I/O, unreachable server)."""


class MetadataMissing(MetadataError):
    """The data directory's metadata is gone while its write-ahead log exists: opening
    would start a fresh, empty catalog over acknowledged data. Restore ``meta/``."""


class MetadataConflict(MetadataError):
    """A compare-and-set found a different version than expected (someone else wrote)."""


class CreatedConcurrently(MetadataError):
    """Another coordinator was creating the same deployment while this open was: it took the
    log over from this open (fenced it) before either wrote its storage record
    (``winner_recorded`` False), or its storage record is there now (True). This open wrote
    no storage record and serves nothing: open the deployment again, which then opens (takes
    over) what the other created. ``sediment.open`` retries the second kind once by itself,
    so it raises it only when the metadata store was given as an object (the failed open
    closed it) or when the retry met the same race (which a store whose reads see every
    write made before them never gives: the retry finds the record)."""

    winner_recorded: bool = False


class MetadataCorruption(MetadataError):
    """A metadata journal or snapshot fails its checksum or format checks, a stored document
    does not decode, or a key the catalog says was written is missing (a relation's trace state)."""


class MetadataUnavailable(MetadataError):
    """The metadata server (ZooKeeper) could not be reached within the timeout."""


class CreationUnknown(MetadataError, OutcomeUnknown):
    """A relation's catalog entry was written but could be neither confirmed nor removed
    again (the metadata store stopped answering): reopen, which serves it if it is there."""


class InvalidMetadataRequest(MetadataError, ValueError):
    """A metadata key is malformed (empty segment, leading slash, ``.``/``..``, control
    character, too long) or a value exceeds the size limit; nothing was written."""


# --- blob stores ----------------------------------------------------------------------------


class BlobError(SedimentError):
    """A blob store operation failed after its retries; nothing was half-committed."""


class BlobCredentialsError(BlobError):
    """The blob store refused or could not find the credentials (no AWS credentials, an unknown
    access key, a bad signature, access denied). Never retried: retrying cannot help until
    the credentials or the bucket policy are fixed."""


class BlobNotFound(BlobError, LookupError):
    """No object at that key."""


class BlobAlreadyExists(BlobError):
    """``put_if_absent`` found an object at that key already."""


class BlobPrefixOwned(BlobError):
    """The blob prefix belongs to another engine (its owner marker names a different engine
    identity), so this engine refuses to use it: its start-up sweep would otherwise delete
    the other engine's batches. Nothing was written or deleted. Use another prefix, or take
    the prefix over explicitly (``take_over_blob_prefix=True``, CLI ``--take-over-blob-prefix``) once the
    other engine is gone for good."""


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


class QuorumLost(ReplicationError, OutcomeUnknown):
    """Fewer than a write quorum of replicas acknowledged. The append was not acknowledged,
    but it may or may not have been written: some replicas may hold it, and the next
    recovery keeps it if a quorum does. Read back or retry idempotently."""


class QuorumUnavailable(ReplicationError, NothingWritten):
    """No write quorum right now (a new store session is being recovered): the append was
    refused before anything was sent, so nothing was written. Retry later."""


class SessionFenced(ReplicationError, OutcomeUnknown):
    """A newer store session exists (or this one's metadata moved on): this coordinator
    has been superseded and must stop. An append in flight may or may not have been
    written (the new coordinator's recovery decides); read back or retry idempotently
    through the coordinator that took over."""


class LogStopped(ReplicationError, OutcomeUnknown):
    """The replicated log stopped (closed, or its coordinator failed) with appends in
    flight: they may or may not have been written; read back or retry idempotently."""


class AppendTimeout(ReplicationError, OutcomeUnknown):
    """An append was not acknowledged within its time limit: it may or may not have been
    written; read back or retry idempotently. Not raised by this version: a stuck replicated
    append ends in QuorumLost once its replicas miss the store session's ``timeout``, and a
    local append waits for its fdatasync. Kept so that callers catching it keep working."""


class StorageRecordMismatch(SedimentError, ValueError):
    """A data directory and a metadata store disagree about where the engine's log and
    batches live: a replicated engine's data directory opened without its ``metadata=``
    (the directory's REPLICATED marker names it), a replicated engine whose batches would
    live where other coordinators cannot reach them, or a metadata store that belongs to
    another engine. Nothing was created or written."""


class PartitionClaimed(ReplicationError, NothingWritten):
    """The storage nodes already hold this partition for another engine (another metadata
    store or ZooKeeper root with the same cluster key). Nothing was written; give each
    engine its own nodes or cluster key."""


class CoordinatorSuperseded(ReplicationError):
    """This coordinator was replaced by a newer one (the message names it): its engine
    refuses reads and writes and closes, and the process serving it must stop
    (``sediment serve`` exits 3 with this message)."""


class ReplicaUnavailable(ReplicationError):
    """The connection to one storage node failed (refused, closed, timed out). Internal to
    the coordinator, which reconnects or closes the store session; callers see QuorumLost."""


class LowWaterMarkRegression(WalError):
    """A partition's low-water mark (or local low-water mark) would move below the stored
    one. Marks only move forward (Waltz refuses the same): a lower one means a coordinator
    with stale state, so the write is refused and the stored state kept."""


class WireError(ReplicationError):
    """Bytes from a peer are not a valid frame (bad magic, version, CRC or length). The
    connection is dropped: nothing in it after that point can be trusted."""


# --- network coordinator ----------------------------------------------------------------------


class ServerError(SedimentError):
    """The server failed with an error that is not one of sediment's typed errors (a bug or an
    environment problem on the server); the message carries the server's error type and text."""


class AuthenticationFailed(SedimentError):
    """The coordinator refused the call's token (missing or wrong). Nothing was done; retrying
    with the same token cannot help: pass the coordinator's token (``--token`` or
    ``$SEDIMENT_TOKEN``)."""


class CallTimedOut(OutcomeUnknown):
    """The client's ``timeout`` passed before the coordinator answered (it is overloaded,
    paused or cut off): the call may or may not have been carried out. Read back before
    writing again, or use a keyed write."""


class CallCancelled(OutcomeUnknown):
    """The call was cancelled before its answer came (the server stopping cancels the
    streams still open; a client may cancel its own): it may or may not have been carried
    out. Read back before writing again, or use a keyed write."""


class TransportFailed(OutcomeUnknown):
    """The transport failed during the call with no word from sediment on the server (a gRPC
    internal error, a stream reset, a server that died mid-call): the call may or may not
    have been carried out. Read back before writing again, or use a keyed write."""


class CallRefused(NothingWritten):
    """The coordinator's transport refused the call before carrying it out (permission
    denied): nothing was done. Retrying the same call cannot help; the message says what
    to change."""


class AppliedKeysUnavailable(NothingWritten):
    """A keyed write's coordinator could not make its table of applied idempotency keys (the
    internal relation ``_cluster.applied``): the metadata holds an entry of that name its engine
    does not serve, a creation by a coordinator it replaced that was neither removed nor
    confirmed. Nothing was written; retry (a keyed write is safe to resend), or reopen the
    engine, which serves the entry if it stays."""


class StageMissing(NothingWritten, LookupError):
    """An ``append_many`` names staged tables the server does not hold: it restarted (or
    stopped) after they were staged, or they were appended or discarded already. Nothing was
    written by this call; send the whole ``append_many`` again (it stages the tables anew)."""


class CoordinatorUnavailable(SedimentError):
    """No coordinator answered at the address (not running, wrong port, TLS mismatch, network).
    A call that was under way when the connection broke may or may not have been carried out."""


# --- the cluster of coordinators ---------------------------------------------------------------


class InvalidAssignmentInput(SedimentError, ValueError):
    """The cluster manager's assignment was asked for with bad input (a negative partition count,
    a partition out of range, a generation below 1); nothing was planned: pass the deployment's
    partition count and the recorded assignment."""


class InvalidIdempotencyKey(NothingWritten, ValueError):
    """An append's idempotency key (client id, sequence number) is malformed or used out of turn
    (a number below 1, an empty client id, a completion of an append not in flight); nothing
    was written: number a client's appends to a partition 1, 2, 3, ... and retry with the same."""


class ClusterError(SedimentError):
    """Base of the errors of a cluster of coordinators (``sediment serve --cluster``)."""


class ClusterMissing(ClusterError, LookupError):
    """No cluster is recorded under the ZooKeeper path given; create it first with
    ``sediment cluster create``."""


class ClusterExists(ClusterError, NothingWritten):
    """``sediment cluster create`` on a path that already records a cluster: it is recorded once."""


class CrossPartitionTransaction(ClusterError, NothingWritten):
    """A transaction (or ``append_many``) names relations of two partitions: a transaction is
    atomic within one partition only. Nothing of the refused call was written."""


class NotPartitionOwner(ClusterError, NothingWritten):
    """A redirect: this coordinator does not serve the relation's partition. ``partition``,
    ``owner`` (the serving member's advertised address, or None while unassigned) and
    ``generation`` say where to go; nothing was read or written here."""

    partition: int = -1
    owner: str | None = None
    generation: int = -1


class MembershipLost(ClusterError, OutcomeUnknown):
    """The coordinator lost (or suspended) its ZooKeeper session while the call ran, so it stops
    acknowledging: the write may or may not have landed; a client retries it at the owner."""
