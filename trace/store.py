"""Traces at rest: trace states in the metadata store, batch objects in the blob store.

A trace state is committed with one compare-and-set on ``trace/<relation id, 16 hex>``;
batches are only ever written under fresh keys before the commit that references
them, and deleted after the commit that stops referencing them. So at every instant
the committed state names complete objects, and anything in the blob store that no
state names is garbage (a crash between a put and its commit), swept at start-up.

A coordinator that takes over rewrites every trace state before it sweeps
(metadata/fence.py): a commit of the coordinator it replaced, made from a version read
before, then fails with CoordinatorSuperseded, never pointing at a swept batch.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from sediment.blob import owner as owner_mod
from sediment.blob.protocol import BlobStore, LocalBlobStore
from sediment.errors import (
    BatchCorruption,
    BlobError,
    BlobNotFound,
    MetadataConflict,
    MetadataCorruption,
    MetadataUnavailable,
    TraceError,
)
from sediment.metadata import names
from sediment.metadata.fence import Fence, rewrite_all
from sediment.metadata.protocol import MetadataStore
from sediment.trace.batch import (  # the private two: a piece is checked as a row group is
    _DECODE_ERRORS,
    DEFAULT_ROW_GROUP_ROWS,
    FORMAT_VERSION,
    RAW_VERSION,
    BatchDescription,
    _check_times,
    batch_key,
    checksums,
    decode_verified,
    encode_batch,
    file_checksums,
    groups_ahead,
    new_nonce,
    open_batch,
    open_stored,
    parse_batch_key,
    read_row_group,
    stored_schema,
)
from sediment.trace.batch_check import batch_problems
from sediment.trace.consolidate import consolidate
from sediment.trace.evolve import Layout
from sediment.trace.merge import merge_to_batch
from sediment.trace.raw_sort import sorted_raw, stored_pieces
from sediment.trace.state import BatchRef, TraceState

STATE_PREFIX = names.TRACES
state_key = names.trace_key


def missing_state(relation_id: int, name: str) -> MetadataCorruption:
    """The error for a trace state that its relation's catalog entry says was written, and is gone."""
    return MetadataCorruption(
        f"relation {name!r} (id {relation_id}): its trace state, metadata key {state_key(relation_id)!r}, is missing, "
        "though its catalog entry says it was written when the relation was added: the compacted part of the "
        "relation (every row no longer in the write-ahead log) would be lost. Restore the key from a copy of "
        "the metadata store")


def _same(table: pa.Table) -> pa.Table:
    return table


def describe(relation_id: int, ref: BatchRef) -> BatchDescription:
    """What the batch's footer must say, given the trace state's reference to it."""
    return BatchDescription(relation_id, ref.lower, ref.upper, ref.since, ref.rows, ref.wal_first, ref.wal_last,
                            ref.level, RAW_VERSION if ref.raw else FORMAT_VERSION, ref.time, ref.diff)


def _row_group_pieces(pf: pq.ParquetFile, index: int, desc: BatchDescription, rows: int,
                      where: str) -> Iterator[pa.Table]:
    """One row group of an opened batch in pieces of at most ``rows`` rows, each checked as
    ``read_row_group`` checks a group: a merge holds a piece of each input, not a whole row
    group (64K rows of 1 KiB are 64 MiB per input, whatever its memory bound)."""
    try:
        for batch in pf.iter_batches(batch_size=rows, row_groups=[index], use_threads=False):
            piece = pa.Table.from_batches([batch])
            try:
                _check_times(piece, desc)
            except TraceError as e:
                raise BatchCorruption(f"{where}: row group {index}: {e}") from e
            yield piece
    except _DECODE_ERRORS as e:
        raise BatchCorruption(f"{where}: row group {index} fails to decode or its page checksum ({e}); "
                              "the object is damaged") from e


_STREAM_BUFFER = (1 << 20, 16 << 20)  # bytes a merge's input reads a column chunk through: a quarter of its share
SPILL_PREFIX = "sediment-merge-"  # a local spill file, never data: swept at open

class TraceStore:
    """Loads, writes and commits traces. Thread-safe as long as each relation's trace
    has one writer at a time (the compacter)."""

    def __init__(self, meta: MetadataStore, blobs: BlobStore, *, spill_dir: str | None = None,
                 fence: Fence | None = None):
        self.meta = meta
        self.fence = fence if fence is not None else Fence()
        self.blobs = blobs
        self._local = blobs if isinstance(blobs, LocalBlobStore) else None  # files: read and link in place
        self.spill_dir = spill_dir
        self._versions: dict[int, int | None] = {}  # metadata version of each loaded state
        self._unresolved: dict[int, tuple[bytes, int]] = {}  # relation id -> (sent, its version) of a commit of
        # unknown outcome not read back
        self._schemas: dict[int, pa.Schema] = {}  # relation id -> update schema, from the catalog
        self._layouts: dict[int, Layout] = {}  # relation id -> its schema versions (trace/evolve.py)
        self._accepted: dict[int, tuple[pa.Schema, ...]] = {}  # stored forms of every version
        self.owner_tag = ""  # prefix of every nonce this engine writes ("" without an identity)
        self._claim: tuple[str, str, bool, str] | None = None
        self.whole_reads = 0  # batches read whole through the checksummed fast path (tests observe it)
        self.memory_bound = 256 << 20  # bytes a raw run's read may hold besides its output (the merge's bound)
        self.raw_spills = 0  # sorted pieces of raw runs spilled to local files (tests observe it)

    def check_owner(self, engine_id: str, where: str, *, take_over: bool = False, data_dir: str = "") -> None:
        """Before anything is written or deleted: refuse (BlobPrefixOwned) a prefix another
        engine identity owns, and tag this engine's batch keys with its identity. The marker
        itself is written by :meth:`sweep_orphans`, after the identity is durably recorded."""
        owner_mod.check_owner(self.blobs, engine_id, where, take_over=take_over)
        self.owner_tag = owner_mod.owner_tag(engine_id)
        self._claim = (engine_id, where, take_over, data_dir)

    def _nonce(self) -> str:
        return self.owner_tag + new_nonce()

    def new_key(self, relation_id: int, lower: int, upper: int) -> str:
        """A fresh batch key of this store's owner, for a file written outside :meth:`write`
        (a bulk load's staged file, engine/staged.py)."""
        return batch_key(relation_id, lower, upper, self._nonce())

    def _is_mine(self, key: str) -> bool:
        try:
            nonce = parse_batch_key(key).nonce
        except BatchCorruption:
            return False  # not a batch key at all: someone else's object
        if not self.owner_tag:
            return True
        return nonce.startswith(self.owner_tag) and len(nonce) > len(self.owner_tag)

    def set_schema(self, relation_id: int, schema: pa.Schema) -> None:
        """The update schema every batch of the relation must have. The engine sets it for each
        relation it registers: the schema is the catalog's, and the catalog belongs to the
        engine, not to this lower layer."""
        self._schemas[relation_id] = stored_schema(schema)
        self._layouts.pop(relation_id, None)
        self._accepted.pop(relation_id, None)

    def set_layout(self, relation_id: int, layout: Layout) -> None:
        """The relation's schema versions: batches of any of them are accepted, read back in
        the current one (projected by field id), and new batches are written with the
        current field ids and version."""
        self.set_schema(relation_id, layout.plain)
        self._layouts[relation_id] = layout
        self._accepted[relation_id] = tuple(stored_schema(s) for s in layout.versions.values())

    def _project(self, relation_id: int, table: pa.Table, layout: Layout | None = None) -> pa.Table:
        """A stored table in the relation's current schema (``layout``'s, when given: a read
        that started before an alter), still sorted and consolidated: rows that differed only
        in a column dropped since are summed together."""
        layout = layout or self._layouts.get(relation_id)
        if layout is None:
            return table
        if layout.is_current(table.schema):  # the same columns: only the field ids and version stamp go
            return pa.Table.from_arrays(table.columns, schema=layout.plain)
        out = layout.project(table)
        if not layout.keeps_order(table.schema):
            out = consolidate(out, [n for n in out.column_names if n not in ("time", "diff")])
        return out

    def _stamped(self, relation_id: int, schema: pa.Schema) -> pa.Schema:
        """``schema`` with the relation's field ids and version, when it is the current one."""
        layout = self._layouts.get(relation_id)
        if layout is None or schema.names != layout.plain.names or schema.types != layout.plain.types:
            return schema
        return layout.stored

    def forget(self, relation_id: int) -> None:
        """A dropped relation: let go of what is kept by its id (ids are never reused, so an
        engine that adds and drops relations for weeks would otherwise keep every one). Its
        compaction commits nothing after the drop (engine/compaction.py checks it is live)."""
        for kept in (self._versions, self._unresolved, self._schemas, self._layouts, self._accepted):
            kept.pop(relation_id, None)

    def schema_of(self, relation_id: int) -> pa.Schema | None:
        """The relation's update schema in the form Parquet gives it back (:func:`stored_schema`);
        None: never set, e.g. a dropped relation or a store used without an engine."""
        return self._schemas.get(relation_id)

    def load(self, relation_id: int) -> TraceState:
        return self.load_many([relation_id])[0]

    def load_many(self, relation_ids: list[int], *, take_over: bool = False,
                  required: Mapping[int, str] | None = None) -> list[TraceState]:
        """The relations' trace states; ``take_over``: each rewritten first, a missing one
        created empty (metadata/fence.py), so that a replaced coordinator's commits fail.
        ``required`` (relation id -> name): relations whose state was written when they were
        added (:meth:`create`); a missing one was lost, and is MetadataCorruption naming its key,
        never an empty trace (nor created empty by a take-over)."""
        keys = [state_key(r) for r in relation_ids]
        required = required or {}
        if take_over:
            empty = {state_key(r): TraceState(r).encode() for r in relation_ids if r not in required}
            got = rewrite_all(self.meta, keys, empty.get)
        else:
            got = [self.meta.get(k) for k in keys]
        for relation_id, value in zip(relation_ids, got, strict=True):
            if value is None and relation_id in required:
                raise missing_state(relation_id, required[relation_id])
        out = []
        for relation_id, value in zip(relation_ids, got, strict=True):
            self._versions[relation_id] = None if value is None else value.version
            if value is None:
                out.append(TraceState(relation_id))
                continue
            state = TraceState.decode(value.value)
            if state.relation_id != relation_id:
                raise TraceError(f"trace state at {state_key(relation_id)} belongs to relation {state.relation_id}")
            out.append(state)
        return out

    def create(self, relation_id: int) -> TraceState:
        """Write a new relation's empty trace state (before its catalog entry: engine/catalog.py
        ``create``), so that from then on a missing one is known to be lost. A compare-and-set
        of unknown outcome is read back, as a commit's is."""
        state = TraceState(relation_id)
        encoded = state.encode()
        try:
            version = self.meta.compare_and_set(state_key(relation_id), encoded, None)
        except MetadataConflict:
            raise MetadataConflict(f"the trace state {state_key(relation_id)!r} of new relation id {relation_id} "
                                   "already exists, though ids are never reused: another engine writes this "
                                   "metadata store; nothing was created") from None
        except MetadataUnavailable:
            version = self._read_back(relation_id, encoded, 0)
        self._versions[relation_id] = version
        return state

    def commit(self, new: TraceState) -> TraceState:
        """Replace the trace state by compare-and-set. CoordinatorSuperseded if it changed: only
        a coordinator that took over writes it besides this one, and nothing was committed.
        A compare-and-set of unknown outcome (MetadataUnavailable) is read back: one that
        landed is a commit; otherwise the error is raised, nothing known to be written."""
        new.check_invariants()
        rid = new.relation_id
        expected = self._versions.get(rid)
        encoded = new.encode()
        try:
            version = self.meta.compare_and_set(state_key(rid), encoded, expected)
        except MetadataConflict:
            self._check_resolved(rid)
            raise self.fence.refuse(f"the trace commit of relation {rid}") from None
        except MetadataUnavailable:
            version = self._read_back(rid, encoded, 0 if expected is None else expected + 1)
        self._unresolved.pop(rid, None)
        self._versions[rid] = version
        return new

    def _read_back(self, rid: int, encoded: bytes, version: int) -> int:
        """After a compare-and-set of unknown outcome: ``version`` (the one it made) if the
        stored state is the one sent (it landed); else the error again (re-raised),
        remembering what was sent when the read fails too. The same bytes at a later version
        are this write rewritten by a take-over (metadata/fence.py; every write adds one to a
        key's version): still a commit, but at ``version``, so the next one is refused."""
        try:
            got = self.meta.get(state_key(rid))
        except MetadataUnavailable:
            self._unresolved[rid] = (encoded, version)
            raise
        if got is not None and got.value == encoded and got.version >= version:
            return version
        raise MetadataUnavailable(f"the trace commit of relation {rid} did not answer and was not there when read back "
                                  f"({state_key(rid)!r}); it is retried")

    def _check_resolved(self, rid: int) -> None:
        """On a conflict: when an earlier commit of unknown outcome is what landed (the bytes
        sent at the version it made: not rewritten by a take-over since), this coordinator's
        state of the relation is behind its own write, not replaced: say so."""
        sent = self._unresolved.get(rid)
        if sent is None:
            return
        got = self.meta.get(state_key(rid))
        if got is not None and (got.value, got.version) == sent:
            raise MetadataConflict(f"relation {rid}: an earlier trace commit whose answer was lost landed "
                                   f"({state_key(rid)!r}), so this coordinator's trace is behind its metadata; "
                                   "nothing more was committed: reopen the engine to load it")


    # --- batches -------------------------------------------------------------------------------

    def write(self, relation_id: int, table: pa.Table, lower: int, upper: int, since: int,
              *, level: int = 0, wal_range: tuple[int, int] | None = None) -> BatchRef:
        """Put a consolidated, sorted table as a batch [lower, upper); an empty table is an
        interval with no object."""
        if table.num_rows == 0:
            return BatchRef(None, lower, upper)
        first, last = wal_range if wal_range else (None, None)
        desc = BatchDescription(relation_id, lower, upper, since, table.num_rows, first, last, level)
        stamped = self._stamped(relation_id, table.schema)
        if stamped is not table.schema:
            table = pa.Table.from_arrays(table.columns, schema=stamped)
        data = encode_batch(table, desc)
        crc, footer_crc = checksums(data)
        key = batch_key(relation_id, lower, upper, self._nonce())
        self.blobs.put_if_absent(key, data)
        return BatchRef(key, lower, upper, table.num_rows, len(data), level, since, first, last, crc, footer_crc)

    def merge(self, relation_id: int, refs: list[BatchRef], key_columns: list[str], schema: pa.Schema,
              since: int, level: int, *, chunk_rows: int, span: tuple[int, int] | None = None) -> BatchRef:
        """Stream-merge adjacent batches into one, through a local spill file, never holding
        the inputs or the output whole. ``span``: the output's ``[lower, upper)`` when the
        inputs are not adjacent intervals (pending runs, whose time spans overlap)."""
        lower, upper = span if span is not None else (refs[0].lower, refs[-1].upper)
        share = self.memory_bound // max(1, sum(r.key is not None for r in refs))
        inputs = [self.read_stream(relation_id, r, memory=share, rows=chunk_rows) for r in refs if r.key is not None]
        if not inputs:
            return BatchRef(None, lower, upper, level=level)
        desc = BatchDescription(relation_id, lower, upper, since, 0, level=level)
        path = self.spill_path()
        try:  # the output's row groups are buffered whole: no larger than the inputs' chunks together
            final = merge_to_batch(inputs, key_columns, self._stamped(relation_id, schema), desc, path,
                                   chunk_rows=chunk_rows,
                                   row_group_rows=min(DEFAULT_ROW_GROUP_ROWS, chunk_rows * len(inputs)))
            if final.rows == 0:
                return BatchRef(None, lower, upper, level=level)
            key = batch_key(relation_id, lower, upper, self._nonce())
            size = os.path.getsize(path)
            crc, footer_crc = file_checksums(path)
            if self._local is not None:
                self._local.put_file(key, path, if_absent=True)
            else:
                with open(path, "rb") as f:
                    self.blobs.put_if_absent(key, f.read())
            return BatchRef(key, lower, upper, final.rows, size, level, since, crc=crc, footer_crc=footer_crc)
        finally:
            if os.path.exists(path):
                os.unlink(path)

    def spill_path(self) -> str:
        """A fresh local file for a merge's output or a raw run's sorted piece: inside a file
        store (swept as a temporary after a crash), else under ``spill_dir`` (swept by
        :meth:`sweep_spills`)."""
        if self._local is not None:
            return self._local.spill_path()
        if self.spill_dir is not None:
            os.makedirs(self.spill_dir, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix=SPILL_PREFIX, suffix=".parquet", dir=self.spill_dir)
        os.close(fd)
        return path

    def sweep_spills(self) -> list[str]:
        """Delete the spill files a crashed process left in ``spill_dir`` (call it only while no
        other process spills there: the engine holds its data directory's lock); their names."""
        if self.spill_dir is None or not os.path.isdir(self.spill_dir):
            return []
        gone = [n for n in os.listdir(self.spill_dir) if n.startswith(SPILL_PREFIX)]
        for name in gone:
            os.unlink(os.path.join(self.spill_dir, name))
        return gone

    def _raw_spill(self) -> str:
        self.raw_spills += 1
        return self.spill_path()

    def read_stream(self, relation_id: int, ref: BatchRef, *, as_stored: bool = False,
                    memory: int | None = None, layout: Layout | None = None,
                    rows: int | None = None) -> Iterator[pa.Table]:
        """A batch's row groups one at a time, each checked against the trace state, in the
        current schema (``as_stored``: as written). A batch written before a column was
        dropped comes whole, once consolidated again in the current schema. A raw run comes
        sorted and consolidated, in pieces, holding about ``memory`` bytes (default
        :attr:`memory_bound`: trace/raw_sort.py). ``layout``: the schema versions to project
        to instead of the relation's current ones (:meth:`read` says why). ``rows``: a batch's
        row groups come in pieces of at most that many rows (a merge's chunk), so a reader holds
        a piece, not a whole row group."""
        if ref.key is None:
            return
        buffer = min(_STREAM_BUFFER[1], max(_STREAM_BUFFER[0], (memory or self.memory_bound) // 4))
        pf, desc = self._open(relation_id, ref, buffer_size=0 if rows is None else buffer)
        where = f"batch {ref.key!r}"
        groups: Iterator[pa.Table] = (
            (read_row_group(pf, i, desc, where=where) for i in range(pf.metadata.num_row_groups)) if rows is None
            else (t for i in range(pf.metadata.num_row_groups)
                  for t in _row_group_pieces(pf, i, desc, rows, where)))
        layout = layout or self._layouts.get(relation_id)
        if ref.raw:  # one row group may be the whole file (Spark's): read in pieces of the budget
            if self._local is not None:  # mapped: Parquet reads a column chunk whole
                pf = pq.ParquetFile(pa.memory_map(str(self._local.local_path(ref.key))), page_checksum_verification=True)
            memory = memory or self.memory_bound
            if as_stored:
                yield from stored_pieces(pf, desc, memory=memory, where=where)
            else:
                pieces = sorted_raw(pf, desc, self._raw_schema(relation_id), memory=memory, spill=self._raw_spill,
                                    where=where)
                yield from (self._project(relation_id, t, layout) for t in pieces)
        elif as_stored or layout is None:
            yield from groups
        elif layout.keeps_order(pf.schema_arrow):
            yield from (self._project(relation_id, g, layout) for g in groups)
        else:
            tables = list(groups)
            if tables:
                yield self._project(relation_id, pa.concat_tables(tables), layout)

    def read(self, relation_id: int, ref: BatchRef, *, use_threads: bool = True,
             layout: Layout | None = None) -> pa.Table | None:
        """A whole batch in memory. When the state recorded the object's CRC32C, the whole
        object is checked first and then decoded without Parquet's page checksums, which the
        object checksum already covers. A local object is checked by streaming the file
        through one reused buffer and decoded from the same open file, as ``pq.read_table``
        reads it: holding the object in a fresh buffer cost 0.06 s of page faults per 130 MB
        here. A remote one is fetched in one piece, and checked and decoded from that buffer.
        ``use_threads=False`` decodes on the caller's thread only. ``layout``: the schema
        versions to project to, a read's own (taken with its trace state), so an alter that
        lands during the read does not change the columns halfway."""
        if ref.key is None:
            return None
        if ref.crc is None or ref.raw:
            tables = list(self._raw_checked(relation_id, ref, layout) if ref.raw
                          else self.read_stream(relation_id, ref, layout=layout))
            return pa.concat_tables(tables) if tables else None
        where = f"batch {ref.key!r}"
        source = self._source(ref, where)
        try:
            table = self._decode_checked(source, relation_id, ref, where, use_threads)
        finally:
            if isinstance(source, pa.NativeFile):
                source.close()
        self.whole_reads += 1
        return self._project(relation_id, table, layout) if table.num_rows else None

    def _raw_schema(self, relation_id: int) -> pa.Schema:
        """The columns a raw run's rows are consolidated in: the relation's stored ones, or
        version 0's for an altered relation (a raw run is only committed while the current
        columns are version 0's), which :meth:`_project` then brings to the current ones."""
        layout = self._layouts.get(relation_id)
        return self.schema_of(relation_id) if layout is None else stored_schema(layout.versions[min(layout.versions)])

    def _raw_checked(self, relation_id: int, ref: BatchRef, layout: Layout | None = None) -> Iterator[pa.Table]:
        """A raw run's consolidated pieces (:meth:`read_stream`) once the whole object's size
        and CRC32Cs, when recorded, match the trace state."""
        if ref.crc is not None:
            where = f"batch {ref.key!r}"
            source = self._source(ref, where)
            try:
                self._check_whole(source, ref, where)
            finally:
                if isinstance(source, pa.NativeFile):
                    source.close()
        yield from self.read_stream(relation_id, ref, layout=layout)

    def _decode_checked(self, source: pa.NativeFile | pa.Buffer, relation_id: int, ref: BatchRef,
                        where: str, use_threads: bool = True) -> pa.Table:
        """The batch decoded from ``source`` once its size and CRC32Cs match the trace state."""
        self._check_whole(source, ref, where)
        return decode_verified(source, describe(relation_id, ref), where=where, schema=self._expected(relation_id),
                               use_threads=use_threads)

    def read_pieces(self, relation_id: int, ref: BatchRef, *, layout: Layout | None = None,
                    each: Callable[[pa.Table], Any] = _same, ahead: int | None = None) -> Iterator[Any]:
        """``each`` of every piece of a whole batch checked as :meth:`read` checks it, in
        storage order: a piece is a row group, decoded, checked and passed through ``each``
        several at a time on the read-ahead pool (``groups_ahead``), so that a reader's work
        on a piece (a replay's sort by time, a snapshot's sums, a catch-up's filter) runs while
        the piece is still in the CPU cache, on every core (at most ``ahead`` row groups in
        flight, within the read-ahead byte budget). A raw run comes in the pieces its
        consolidation makes, a batch without a recorded checksum as one piece."""
        layout = layout or self._layouts.get(relation_id)
        if ref.raw:  # consolidated a piece at a time (trace/raw_sort.py)
            yield from map(each, self._raw_checked(relation_id, ref, layout))
            return
        if ref.key is None or ref.crc is None:
            table = self.read(relation_id, ref, layout=layout)
            if table is not None:
                yield each(table)
            return
        where = f"batch {ref.key!r}"
        source = self._source(ref, where)
        self.whole_reads += 1
        try:
            self._check_whole(source, ref, where)
            pf, desc = open_batch(source if isinstance(source, pa.NativeFile) else pa.BufferReader(source),
                                  describe(relation_id, ref), where=where, schema=self._expected(relation_id),
                                  page_checks=False)  # the object's checksum covers its pages
            if layout is None or layout.is_current(pf.schema_arrow):
                plain = None if layout is None else layout.plain
                yield from groups_ahead(pf, source, desc, where, page_checks=False, most=ahead, each=each if plain is None
                                        else lambda t: each(pa.Table.from_arrays(t.columns, schema=plain)))
                return
            older = pa.concat_tables(list(groups_ahead(pf, source, desc, where, _same, page_checks=False)))
        finally:
            if isinstance(source, pa.NativeFile):
                source.close()
        yield each(self._project(relation_id, older, layout))  # written before a column was dropped

    def read_as_stored(self, relation_id: int, ref: BatchRef, *, layout: Layout | None = None) -> Iterator[pa.Table]:
        """A batch's row groups in storage order for a streaming reader, in bounded memory.
        A local object with a recorded checksum is checked whole first (a pass over the
        file, far cheaper than Parquet's page checksums) and decoded several row groups at
        a time (:meth:`read_pieces`); a remote one is streamed a row group at a time with its
        page checksums (:meth:`read_stream`), never fetched whole."""
        if self._local is not None and ref.crc is not None and not ref.raw:
            return self.read_pieces(relation_id, ref, layout=layout)
        return self.read_stream(relation_id, ref, layout=layout)

    def _source(self, ref: BatchRef, where: str) -> pa.NativeFile | pa.Buffer:
        """The stored object: a local file opened (an unlink meanwhile is harmless), a remote one fetched whole."""
        try:
            return pa.OSFile(self._local.local_path(ref.key)) if self._local is not None \
                else pa.py_buffer(self.blobs.get(ref.key))
        except (BlobNotFound, FileNotFoundError) as e:
            raise BatchCorruption(f"{where} is missing from the blob store; the trace state references it") from e
        except OSError as e:
            raise BlobError(f"reading {where} from {self.blobs!r} failed: {e}; check the disk and the file's "
                            "permissions, then retry") from e

    def _check_whole(self, source: pa.NativeFile | pa.Buffer, ref: BatchRef, where: str) -> None:
        """Raise BatchCorruption unless ``source``'s size and CRC32Cs match the trace state."""
        local = isinstance(source, pa.NativeFile)
        try:
            size = source.size() if local else source.size
            if size != ref.bytes:
                raise BatchCorruption(f"{where}: object is {size} bytes but the trace state says {ref.bytes}")
            got = file_checksums(source, where) if local else checksums(memoryview(source), where)
        except OSError as e:
            raise BlobError(f"reading {where} from {self.blobs!r} failed: {e}; check the disk and the file's "
                            "permissions, then retry") from e
        if got != (ref.crc, ref.footer_crc if ref.footer_crc is not None else got[1]):
            raise BatchCorruption(f"{where}: CRC32C (object, footer) is {got} but the trace state recorded "
                                  f"{(ref.crc, ref.footer_crc)}; the object is damaged (run sediment verify)")

    def _open(self, relation_id: int, ref: BatchRef, buffer_size: int = 0):
        return open_stored(self.blobs, ref.key, describe(relation_id, ref), expected_bytes=ref.bytes,
                           footer_crc=ref.footer_crc, schema=self._expected(relation_id), buffer_size=buffer_size)

    def _expected(self, relation_id: int) -> pa.Schema | tuple[pa.Schema, ...] | None:
        """The footer schemas a batch of the relation may have: one per schema version."""
        return self._accepted.get(relation_id) or self.schema_of(relation_id)

    def delete(self, keys: Iterable[str]) -> None:
        for key in keys:
            self.blobs.delete(key)

    def sweep_orphans(self, referenced: set[str]) -> list[str]:
        """Claim the prefix (after :meth:`check_owner`), then delete every batch under ``trace/``
        that this engine wrote (its nonce carries this engine's tag) and no trace state
        references. Objects of other writers are never touched."""
        if self._claim is not None:
            engine_id, where, take_over, data_dir = self._claim
            owner_mod.claim(self.blobs, engine_id, where, take_over=take_over, data_dir=data_dir)
            self._claim = None
        orphans = [k for k in self.blobs.list(STATE_PREFIX) if k not in referenced and self._is_mine(k)]
        self.delete(orphans)
        if self._local is not None:
            orphans += self._local.sweep_temporaries()
        return orphans

    def verify(self, state: TraceState, schema: pa.Schema | None = None) -> list[str]:
        """Problems with a trace: invariants, and every referenced object read in full with
        its size, whole-object and footer checksums, description, schema and page checksums
        checked."""
        if schema is not None:
            self.set_schema(state.relation_id, schema)
        problems = []
        try:
            state.check_invariants()
        except TraceError as exc:
            problems.append(str(exc))
        for ref in (*state.batches, *state.pending):
            if ref.key is not None:
                problems += batch_problems(self.blobs, ref,
                                           lambda r: self.read_stream(state.relation_id, r, as_stored=True))
        return problems
