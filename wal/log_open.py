"""Find (or explicitly create) a file log's control file and manifest.

A log is created only when asked (``create``) and only where no part of one exists:
a missing control file or manifest next to surviving segments is a lost file, never a
reason to start over with a new cluster key (PostgreSQL refuses a missing WAL segment the
same way). ``repair`` may rebuild a lost control file or manifest from what survives.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field

from sediment._fs import makedirs_durable
from sediment.errors import WalCorruption, WalMissing
from sediment.wal import manifest as mf
from sediment.wal import segment as sg
from sediment.wal.control import CONTROL_NAME, ControlFile
from sediment.wal.log_reader import list_segments
from sediment.wal.segment_writer import Segment


def _segment_key(pdir: str, firsts: list[int]) -> uuid.UUID | None:
    for first in firsts:
        with open(os.path.join(pdir, sg.segment_name(first)), "rb") as f:
            h = sg.parse_header(f.read(sg.HEADER_SIZE))
        if h is not None:
            return h.cluster_key
    return None


def _empty_start(pdir: str, firsts: list[int]) -> bool:
    """An interrupted creation: at most segment 0, holding no record."""
    if not firsts:
        return True
    return firsts == [0] and not sg.scan_segment(os.path.join(pdir, sg.segment_name(0)), 0).offsets


def _remove_empty_start(pdir: str, firsts: list[int]) -> None:
    """Delete an interrupted creation's empty segment 0 (see :func:`_empty_start`), durably."""
    sg.remove_segment_files(pdir, [Segment.in_dir(pdir, first) for first in firsts])


def _check_manifest_key(manifest: mf.Manifest, key: uuid.UUID, man_path: str, ctl_path: str) -> None:
    if manifest.cluster_key != key:
        raise WalCorruption(f"log manifest {man_path} belongs to cluster {manifest.cluster_key}, control file "
                            f"{ctl_path} to {key}", path=man_path, offset=8, reason="cluster key mismatch")


@dataclass
class OpenDecision:
    """What opening a file log's partition will do (see :func:`decide_open`): ``control`` is
    "read", "create" (a new log) or "rebuild" (lost, rebuilt by repair with ``key``);
    ``manifest`` is "read", "new" (a log created now, or an interrupted creation finished) or
    "rebuilt" (lost, stood in for by repair)."""

    control: str
    manifest: str
    control_file: ControlFile | None = None
    manifest_record: mf.Manifest | None = None
    key: uuid.UUID | None = None
    add_partition: bool = False
    firsts: list[int] = field(default_factory=list)


def decide_open(directory: str, partition: int, cluster_key: uuid.UUID | None, *,
                create: bool, repair: bool) -> OpenDecision:
    """The one rule deciding whether a file log opens, is created, or is refused -- read-only,
    so ``sediment verify`` runs exactly what open runs (an interrupted creation is not a lost
    manifest in one and fine in the other). Raises WalMissing / WalError / WalCorruption
    where open refuses."""
    ctl_path = os.path.join(directory, CONTROL_NAME)
    man_path = os.path.join(directory, mf.manifest_name(partition))
    pdir = os.path.join(directory, str(partition))
    firsts, _ = list_segments(pdir)
    has_ctl, has_man = os.path.exists(ctl_path), os.path.exists(man_path)
    if not (has_ctl or has_man or firsts) and not create:
        raise WalMissing(f"no write-ahead log at {directory} (no control file {CONTROL_NAME}, manifest or segment) "
                         "where one was expected: restore the directory, or point at the right data directory",
                         path=ctl_path, reason="log missing")
    manifest = mf.read(directory, partition) if has_man else None
    d = OpenDecision("read", "read", manifest_record=manifest, firsts=firsts)
    if has_ctl:
        d.control_file = ControlFile.open(directory)
        d.control_file.check_cluster(cluster_key)
        key = d.control_file.header.cluster_key
        listed = partition in d.control_file.partitions
    elif has_man or firsts:
        key = manifest.cluster_key if manifest is not None else _segment_key(pdir, firsts)
        if not repair or key is None:
            raise WalMissing(f"{ctl_path}: offset 0: control file missing while the log's manifest or segments exist; "
                             "restore it (`sediment verify --repair` rebuilds it with the log's own cluster key)",
                             path=ctl_path, reason="control file missing")
        d.control, listed = "rebuild", True
    else:
        d.control, key, listed = "create", cluster_key, False
    d.key = key
    if manifest is not None and key is not None:
        _check_manifest_key(manifest, key, man_path, ctl_path)
    if not listed:
        if manifest is not None or not _empty_start(pdir, firsts):
            raise WalMissing(f"control file {ctl_path} does not list partition {partition}, whose log exists",
                             path=ctl_path, reason="partition missing from control file")
        d.add_partition = True
    if manifest is not None:
        return d
    # A completed open writes the manifest durably before it records its session in the
    # control file: a recorded session proves a manifest existed, so its absence is a loss.
    opened_before = (d.control_file is not None and partition in d.control_file.partitions
                     and d.control_file.read_state(partition).session_id > 0)
    if create and _empty_start(pdir, firsts) and not opened_before:
        d.manifest = "new"
    elif repair:
        d.manifest = "rebuilt"
    else:
        raise WalMissing(f"log manifest {man_path} is missing: the log cannot tell which segments it must hold; "
                         "restore it, or run `sediment verify --repair` to rebuild it from the segments found",
                         path=man_path, reason="manifest missing")
    return d


def open_control_and_manifest(directory: str, partition: int, cluster_key: uuid.UUID | None, *,
                              create: bool, repair: bool) -> tuple[ControlFile, mf.Manifest, str]:
    """The control file, the manifest and how it was had: "read", "new" (a log created now)
    or "rebuilt" (lost, stood in for by repair).

    Carries out :func:`decide_open`; writes only when creating (nothing of a log exists, or
    only an interrupted creation) or repairing a lost control file or manifest."""
    d = decide_open(directory, partition, cluster_key, create=create, repair=repair)
    pdir = os.path.join(directory, str(partition))
    if d.control == "read":
        assert d.control_file is not None
        control = d.control_file
    elif d.control == "rebuild":
        assert d.key is not None
        control = ControlFile.create(directory, d.key)
        control.add_partition(partition)
    else:
        makedirs_durable(directory)
        control = ControlFile.create(directory, cluster_key)
    if d.add_partition and partition not in control.partitions:
        control.add_partition(partition)
    makedirs_durable(pdir)
    key = control.header.cluster_key
    if d.manifest == "read":
        assert d.manifest_record is not None
        return control, d.manifest_record, "read"
    if d.manifest == "new":
        _remove_empty_start(pdir, d.firsts)
        return control, mf.Manifest(key, partition), "new"
    return control, mf.Manifest(key, partition, start_lsn=d.firsts[0] if d.firsts else 0), "rebuilt"


def open_replica_manifest(directory: str, partition: int, control: ControlFile) -> tuple[mf.Manifest, bool]:
    """A storage node's partition: its manifest, and whether it is created now.

    The node's control file is the record of which partitions it holds: a partition it does
    not list (or lists with a state never written and holds no record -- an interrupted first
    start) is new; for any other, a missing manifest is WalMissing, never a fresh, empty
    replica that would answer the coordinator as if it had lost nothing. The caller holds
    the control file's lock and adds the partition to it."""
    man_path = os.path.join(directory, mf.manifest_name(partition))
    pdir = os.path.join(directory, str(partition))
    key = control.header.cluster_key
    if os.path.exists(man_path):
        manifest = mf.read(directory, partition)
        _check_manifest_key(manifest, key, man_path, control.path)
        if partition not in control.partitions:
            raise WalMissing(f"control file {control.path} does not list partition {partition}, whose manifest "
                             f"{man_path} exists: restore the control file, or move the partition away",
                             path=control.path, reason="partition missing from control file")
        return manifest, False
    firsts, _ = list_segments(pdir)
    listed = partition in control.partitions
    if (not listed or control.read_state(partition).sequence == 0) and _empty_start(pdir, firsts):
        _remove_empty_start(pdir, firsts)
        makedirs_durable(pdir)
        return mf.Manifest(key, partition), True
    raise WalMissing(f"log manifest {man_path} of partition {partition} is missing while the node's control "
                     f"file {control.path} says it holds this partition: the replica cannot tell which records it "
                     "must have, so it refuses the partition. Restore the manifest, or move the node's whole storage "
                     "directory away (the node then starts empty and the coordinator catches it up from its peers)",
                     path=man_path, reason="manifest missing")
