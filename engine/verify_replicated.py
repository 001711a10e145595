"""``sediment verify`` of a replicated engine: what it holds lives outside its data directory.

A replicated engine's data directory holds only its ``REPLICATED`` marker (engine/data_dir.py);
the catalog, the trace states, the storage record and the partition's metadata are in the
metadata store the marker names, the batches in the shared blob store, and the log on the
storage nodes. Verifying the directory alone would check nothing, so this checks each,
read-only:

* the marker (its checksum) and the metadata store it names (reachable, every key readable);
* the storage record (replicas, cluster key, blob store) and the partition metadata;
* every trace and every batch it references, as for a local engine (engine/verify.py);
* a log on S3 (``wal="s3://..."``) as its open reads it, and that it reaches every trace;
* every storage node's copy of the partition (wal/replication/replica_check.py: INFO, then
  every record read back with its checksums): at least a write quorum must be reachable
  and undamaged (the engine does not open without one), none may hold a session newer than
  the metadata's (another metadata store uses those nodes), and their records must reach
  the log position every trace says it has taken (else acknowledged records are lost).

Whatever cannot be checked (the metadata store or a quorum of nodes unreachable) is a
problem naming what could not be checked: verify never says "ok" about what it did not see.
"""

from __future__ import annotations

import os

from sediment.engine.data_dir import MARKER_NAME, StorageRecord, read_marker, trace_ends, traces_past_log
from sediment.engine.verify import VerifyReport, verify_trace_batches
from sediment.errors import SedimentError
from sediment.metadata import names
from sediment.wording import counted


def verify_replicated(data_dir: str, spec: str, report: VerifyReport, *, blob: str | None = None,
                      s3_endpoint: str | None = None, timeout: float = 5.0) -> None:
    """Check the replicated engine whose metadata store is ``spec`` (see the module doc)."""
    from sediment.metadata.open_store import open_metadata_store

    report.what, report.kinds = "item", "marker, metadata keys, batches, storage-node partitions"
    try:
        store = open_metadata_store(spec, timeout=timeout) if spec.startswith("zk://") else open_metadata_store(spec)
    except SedimentError as exc:
        report.problems.append(f"cannot check the replicated engine of {data_dir}: its metadata store {spec} "
                               f"cannot be opened ({exc}); nothing was checked")
        return
    try:
        meta = {key: got for key in store.list("") if (got := store.get(key)) is not None}
    except SedimentError as exc:
        report.problems.append(f"cannot read the metadata store {spec} ({exc}); nothing was checked")
        return
    finally:
        store.close()
    at = spec.split("?", 1)[0].rstrip("/")  # where the keys are: an s3:// spec's ?endpoint= is no part of it
    report.checked += [f"{at}/{key}" for key in sorted(meta)]
    record = _storage_record(meta, at, report)
    if record is None:
        return
    uri = blob or record.blob
    if not uri:
        report.problems.append(f"{at}/{names.STORAGE}: records no blob store; the engine refuses to open "
                               "(pass --blob s3://bucket/prefix)")
    else:
        verify_trace_batches(meta, uri, s3_endpoint or record.s3_endpoint, report)
    if record.wal_spec.kind == "s3":
        _verify_s3_log(meta, record, report)
    else:
        _verify_partition(meta, record, at, report, timeout)


def _verify_s3_log(meta: dict, record: StorageRecord, report: VerifyReport) -> None:
    """The log on S3 as its open reads it (wal/s3_objects.py), then that it reaches every trace."""
    from sediment.wal.s3_log import check_log

    report.what, report.kinds = "item", "marker, metadata keys, batches, the log on S3"
    try:
        end, notes, checked = check_log(record.wal, record.s3_endpoint)
    except SedimentError as exc:
        report.problems.append(f"{type(exc).__name__}: {exc} (open refuses)")
        return
    report.notes += notes
    report.checked.append(f"{record.wal}: {counted(checked, 'object')}, LSN up to {end - 1}")
    report.problems += [f"in the log on S3: {p}" for p in traces_past_log(record.wal, end, trace_ends(meta))]


def _storage_record(meta: dict, spec: str, report: VerifyReport) -> StorageRecord | None:
    got = meta.get(names.STORAGE)
    where = f"{spec}/{names.STORAGE}"
    if got is None:
        report.problems.append(f"{where}: no storage record: the metadata store holds no replicated engine "
                               "(wrong ZooKeeper root, or the engine was never opened); nothing else was checked")
        return None
    try:
        record = StorageRecord.decode(got.value)
    except ValueError as exc:
        report.problems.append(f"{where}: not valid JSON ({exc}); restore the key")
        return None
    if (not record.replicas or not record.cluster_key) and record.wal_spec.kind != "s3":
        report.problems.append(f"{where}: names no replicas or cluster key ({sorted(record.as_dict())}): not a "
                               "replicated engine's record; open the data directory without --metadata")
        return None
    return record


def _verify_partition(meta: dict, record: StorageRecord, spec: str, report: VerifyReport, timeout: float) -> None:
    """The partition metadata, then every node's copy of the log against it and the traces."""
    from sediment.wal.replication.partition_meta import PartitionMeta
    from sediment.wal.replication.replica_check import inspect_replicas
    from sediment.wal.replication.vote import quorum_size

    log_partition = record.log_partition or 0  # a cluster's partition n is log partition n on the nodes
    key = names.partition_key(log_partition)
    got = meta.get(key)
    if got is None:
        report.problems.append(f"{spec}/{key}: no partition metadata although the storage record exists; "
                               "the engine's log was never started or the key was deleted: restore it")
        return
    try:
        partition = PartitionMeta.decode(got.value, key)
    except SedimentError as exc:
        report.problems.append(str(exc))
        return
    replicas = list(record.replicas)
    found = inspect_replicas(replicas, record.cluster_key, log_partition, timeout)
    good = []
    for r in found:
        where = f"storage node {r.address} partition {log_partition}"
        if not r.reachable:
            report.notes.append(f"{where}: not reachable, not checked ({r.error})")
            continue
        report.checked.append(f"{where}: LSN {r.first_lsn}..{r.max_lsn} ({counted(r.records, 'record')})")
        if r.node_session > partition.session_id:
            report.problems.append(f"{where}: at session {r.node_session}, newer than the metadata's "
                                   f"{partition.session_id}: another metadata store uses these nodes (open refuses)")
        elif r.damage:
            report.notes.append(f"{where}: {r.damage} (the replica is truncated and caught up at the next open)")
        else:
            good.append(r)
    quorum = quorum_size(len(replicas))
    if len(good) < quorum:
        report.problems.append(f"only {len(good)} of {len(replicas)} storage nodes ({', '.join(replicas)}) could be "
                               f"checked undamaged; the engine needs {quorum} to open: start them, then verify again")
        return
    end = max(r.max_lsn for r in good) + 1
    report.problems += [f"on the storage nodes: {p}" for p in traces_past_log(spec, end, trace_ends(meta))]


def replicated_spec(data_dir: str, metadata: str | None, report: VerifyReport) -> str | None:
    """The metadata store to verify against: ``--metadata``, else the one the marker names;
    None for a local data directory (or a damaged marker, reported as a problem)."""
    try:
        marked = read_marker(data_dir)
    except SedimentError as exc:
        report.problems.append(str(exc))
        return None
    if marked is not None:
        report.checked.append(os.path.join(data_dir, MARKER_NAME))
    if marked is not None and marked.startswith("<"):
        report.problems.append(f"{os.path.join(data_dir, MARKER_NAME)}: names the metadata store {marked}, an object "
                               "given in Python, not a spec verify can open; pass --metadata zk://host:port/root")
        return None
    return metadata or marked


def _shared_metadata(data_dir: str, metadata: str | None) -> bool:
    """Whether ``--metadata`` names a deployment another coordinator could open from any
    directory: always ``zk://``; ``s3://`` unless this data directory holds a local log (then
    it is an embedded engine that keeps only its catalog in S3, checked locally)."""
    if not metadata:
        return False
    if metadata.startswith("zk://"):
        return True
    return metadata.startswith("s3://") and not os.path.isdir(os.path.join(data_dir, "wal"))


def verify_engine(data_dir: str, *, metadata: str | None = None, blob: str | None = None,
                  s3_endpoint: str | None = None) -> VerifyReport:
    """What ``sediment verify`` runs: a replicated engine's stores and nodes when the data
    directory's marker (or a ``zk://`` ``metadata``, or an ``s3://`` one for a directory with
    no local log: an S3-only deployment checked from another machine) says it is one, else
    the local checks."""
    from sediment.engine.verify import verify_data_dir

    report = VerifyReport()
    if os.path.isdir(data_dir) or metadata:
        spec = replicated_spec(data_dir, metadata if _shared_metadata(data_dir, metadata) else None, report)
        if spec is not None:
            verify_replicated(data_dir, spec, report, blob=blob, s3_endpoint=s3_endpoint)
            return report
        if report.problems:
            return report
    return verify_data_dir(data_dir, blob=blob, s3_endpoint=s3_endpoint)
