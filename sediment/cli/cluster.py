"""``sediment cluster create|status`` and ``sediment serve --cluster``: a cluster of coordinators.

    sediment cluster create --metadata zk://HOST:PORT/NAME --partitions N --replicas H:P,...
                            --cluster-key K --blob s3://bucket/prefix [--session-timeout S]
    sediment cluster create --metadata 's3://bucket/prefix?endpoint=URL' --partitions N
                            --blob s3://bucket/blobs [--wal s3://bucket/wal] [--session-timeout S]
                            (no --replicas, no --cluster-key: it has no storage nodes)
    sediment serve --cluster zk://HOST:PORT/NAME --listen HOST:PORT [--advertise grpc://HOST:PORT]
    sediment --connect zk://HOST:PORT/NAME cluster status [--json]

A cluster on ``s3://`` is S3-only: no ZooKeeper, no storage nodes; each partition is an
engine on the S3 log, and membership is by leases (cluster/s3_membership.py), whose lease
time is ``--session-timeout``.

The cluster's runtime is ``sediment.cluster`` (membership, assignment, routing); this module
only parses, prints and runs the member behind the same Flight server as ``serve``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from typing import Any

from sediment.cli.arg_types import positive_seconds
from sediment.cli.files import UsageError
from sediment.wording import counted

LEAVE_TIMEOUT = 20.0  # seconds a SIGTERM'd member waits for its partitions to move before it exits anyway


def add_cluster_parser(sub: argparse._SubParsersAction, command: Any, add_common: Any) -> None:
    """``cluster create`` and ``cluster status`` (the global options come from ``add_common``)."""
    cluster = sub.add_parser("cluster", help="create a cluster of coordinators, or show its state",
                             description="Create a cluster of coordinators, or show its state.")
    add_common(cluster, top=False)
    cl_sub = cluster.add_subparsers(dest="cluster_command", required=True, metavar="ACTION")
    p = command("create", cmd_cluster_create, "record a cluster once: partitions, storage nodes, blob store "
                "(with --metadata zk://HOST:PORT/NAME --replicas --cluster-key --blob; or, S3 alone, "
                "--metadata s3://BUCKET/PREFIX --blob [--wal])", cl_sub)
    p.add_argument("--partitions", type=int, required=True, metavar="N", help="how many partitions (fixed)")
    p.add_argument("--session-timeout", type=positive_seconds, default=10.0, metavar="SECONDS",
                   help="members' ZooKeeper session timeout (an S3-only cluster's lease time): a killed member's "
                        "partitions move after it (default 10)")
    p = command("status", cmd_cluster_status, "members, the manager, and per partition its owner, generation, "
                "sealed frontiers and WAL backlog (with --connect zk://HOST:PORT/NAME or s3://BUCKET/PREFIX, and "
                "--token or $SEDIMENT_TOKEN for the owners' figures)", cl_sub)
    p.add_argument("--json", action="store_true", help="print the same as JSON")


def _cluster_uri(args: argparse.Namespace, option: str) -> str:
    uri = getattr(args, option, None) or ""
    if not uri.startswith(("zk://", "s3://")):
        raise UsageError(f"give the cluster as --{option} zk://HOST:PORT/NAME or s3://BUCKET/PREFIX"
                         + (f", not {uri!r}" if uri else ""))
    return uri


def cmd_cluster_create(args: argparse.Namespace) -> int:
    from sediment.cluster import layout

    uri = _cluster_uri(args, "metadata")
    if uri.startswith("s3://"):
        return _create_s3_cluster(args, uri)
    where = layout.ClusterPath.parse(uri)
    if not args.replicas or not args.cluster_key or not args.blob:
        raise UsageError("cluster create needs --replicas H:P,..., --cluster-key K and --blob s3://... (or file://)")
    config = layout.ClusterConfig(partitions=args.partitions, replicas=args.replicas.split(","),
                                  cluster_key=args.cluster_key, blob=args.blob, s3_endpoint=args.s3_endpoint,
                                  session_timeout=args.session_timeout)
    layout.check_config(config)
    _check_blob_reachable(config.blob, config.s3_endpoint)
    zk = layout.connect_zk(where)
    try:
        layout.create(zk, where, config)
    finally:
        zk.stop()
        zk.close()
    print(f"created cluster {where.uri}: {counted(config.partitions, 'partition')} on {','.join(config.replicas)}")
    return 0


def _create_s3_cluster(args: argparse.Namespace, uri: str) -> int:
    """An S3-only cluster: partition ``n`` on the S3 log at ``<wal>/p<n>`` (``--wal``, default
    ``<blob>/wal``), its batches under ``<blob>/p<n>``, its metadata under the cluster's prefix."""
    from sediment.cluster import layout, s3_layout

    where = s3_layout.S3ClusterPath.parse(uri)
    if args.replicas:
        raise UsageError("an S3-only cluster (--metadata s3://...) has no storage nodes: leave --replicas out")
    if args.cluster_key:
        raise UsageError("--cluster-key is the storage nodes' key, and an S3-only cluster (--metadata s3://...) has "
                         "none (its partitions' logs are on S3): leave --cluster-key out; nothing was created")
    if not args.blob:
        raise UsageError("cluster create needs --blob s3://bucket/prefix")
    wal = args.wal or f"{args.blob.rstrip('/')}/wal"
    config = layout.ClusterConfig(partitions=args.partitions, replicas=[], cluster_key="",
                                  blob=args.blob, s3_endpoint=args.s3_endpoint or where.endpoint,
                                  session_timeout=args.session_timeout, wal=wal)
    s3_layout.check_config(config)
    _check_blob_reachable(config.blob, config.s3_endpoint)
    store = s3_layout.open_store(where)
    try:
        s3_layout.create(store, where, config)
    finally:
        store.close()
    print(f"created cluster {where.uri}: {counted(config.partitions, 'partition')} on the S3 log at {wal}")
    return 0


def _check_blob_reachable(blob: str, s3_endpoint: str | None) -> None:
    """Read one key of an S3 blob store before the cluster is recorded: a missing bucket, a
    wrong endpoint or credentials were found only by the members, each retrying its partitions'
    opens every second, while clients heard only that no owner answered."""
    if not blob.startswith("s3://"):
        return
    from sediment.blob.uri import open_blob_store
    from sediment.errors import BlobNotFound

    store = open_blob_store(blob, s3_endpoint=s3_endpoint)
    try:
        store.get("sediment-owner")
    except BlobNotFound:
        pass
    finally:
        store.close()


def cmd_cluster_status(args: argparse.Namespace) -> int:
    from sediment.cluster_client import cluster_status
    from sediment.net.protocol import TOKEN_ENV

    uri = getattr(args, "connect", None) or getattr(args, "metadata", None) or ""
    if not uri.startswith(("zk://", "s3://")):
        raise UsageError("cluster status needs --connect zk://HOST:PORT/NAME or s3://BUCKET/PREFIX"
                         + (f", not {uri!r}" if uri else ""))
    token = getattr(args, "token", None) or os.environ.get(TOKEN_ENV)
    status = cluster_status(uri, token)
    if args.json:
        print(json.dumps(status, indent=2, sort_keys=True))
        return 0
    manager = status["manager"] or (f"none (no member is running: start one with `sediment serve --cluster "
                                    f"{status['cluster']}`)")
    print(f"cluster {status['cluster']}: manager {manager}")
    for member in status["members"]:
        print(f"member {member['id']} {member['advertise']}")
    for p in status["partitions"]:
        print(f"partition {p['partition']}: owner {p['owner'] or 'none'} generation {p['generation']}, "
              f"{_partition_figures(p, token is not None)}")
    return 0


def _partition_figures(p: dict, token: bool) -> str:
    """A partition's relations and WAL backlog in words (as `relation list` says sealed=T); a
    Python dict printed as JSON (`sealed {}`) read as a syntax, not as "no relations"."""
    if p["wal_backlog_bytes"] is None:  # its owner was not asked, or did not answer
        why = "the owner did not answer" if token else "no token to ask the owner: pass --token or set $SEDIMENT_TOKEN"
        return f"relations and WAL backlog unknown ({why})"
    sealed = p["sealed"]
    relations = " ".join(f"{name}={t}" for name, t in sorted(sealed.items()))
    return (f"sealed {relations}" if sealed else "no relations") + f", WAL backlog {p['wal_backlog_bytes']} bytes"


def _member_directory(directory: str, cluster: str) -> tuple[int, str | None]:
    """Lock a member's ``--data-dir`` (made if missing) before it joins, and record in it whose
    member keeps its partitions there (``MEMBER``: until the first partition opens, the lock
    alone looked like an engine's directory): (the descriptor that holds the lock, the
    outermost directory made). A directory holding an engine is refused: the member would make
    its partitions' engines inside another engine's directory. A second member on the same
    directory is refused as well: its partition opens would fail on the first one's locks,
    once a second."""
    from sediment._fs import makedirs_durable
    from sediment.engine.data_dir import DataDir

    where = DataDir(directory)
    if where.holds_engine():
        raise UsageError(f"--data-dir {directory} holds an engine (meta/, wal/ or REPLICATED): a cluster member "
                         "keeps its partitions in a directory of its own; give another --data-dir")
    created = makedirs_durable(directory)
    lock = None
    try:
        lock = where.take_lock()
        where.mark_member(cluster)
        return lock, created
    except BaseException:
        if lock is not None:
            os.close(lock)
        if created is not None:
            from sediment._fs import undo_makedirs

            undo_makedirs(created, directory, whole=False)
        raise


def serve_cluster(args: argparse.Namespace, location: str, token: str, tls: tuple[bytes, bytes] | None,
                  stop: threading.Event) -> int:
    """Join the cluster as a member and serve its partitions until SIGTERM, then hand them over."""
    from sediment._fs import undo_makedirs
    from sediment.cli.common import data_dir_of
    from sediment.cluster.directory import parse_cluster

    where = parse_cluster(_cluster_uri(args, "cluster"))
    directory = os.path.abspath(data_dir_of(args))
    _lock, created = _member_directory(directory, where.uri)  # held until the process exits
    try:
        return _serve_member(args, where, location, token, tls, stop)
    except BaseException:
        if created is not None and set(os.listdir(directory)) <= {"LOCK", "MEMBER"}:  # a first start that never served
            undo_makedirs(created, directory, whole=True)
        raise


def _serve_member(args: argparse.Namespace, where: Any, location: str, token: str,
                  tls: tuple[bytes, bytes] | None, stop: threading.Event) -> int:
    from sediment.cli.common import data_dir_of
    from sediment.cluster.member import Member
    from sediment.cluster.router import ClusterEngine
    from sediment.server import SedimentFlightServer

    member = Member(where, args.advertise or "", data_dir_of(args))
    server = SedimentFlightServer(ClusterEngine(member), location, token,
                                  txn_idle_timeout=args.txn_idle_timeout or None, tls=tls,
                                  max_append_bytes=args.max_append_bytes)
    advertise = member.advertise = args.advertise or server.uri
    metrics = None
    try:
        member.start()
        if args.metrics_listen is not None:
            from sediment.metrics import MetricsServer

            metrics = MetricsServer(member.metrics, *args.metrics_listen)
            print(f"metrics on {metrics.url}", flush=True)
        print(f"serving cluster {where.uri} as {member.member_id} advertised {advertise} on {server.uri}",
              flush=True)
        while not stop.wait(0.5):
            pass
        sys.stderr.write("leaving: handing partitions over\n")
        sys.stderr.flush()
        held = member.leave(LEAVE_TIMEOUT)
        if held is not None:
            sys.stderr.write(f"sediment serve: partitions not handed over ({held}); closing them\n")  # one write:
            sys.stderr.flush()  # the log lines of other threads go to the same stream
    finally:
        try:
            server.stop(grace=args.shutdown_grace)
            if metrics is not None:
                metrics.stop()
        finally:
            member.stop()
    print(f"stopped serving cluster {where.uri}", flush=True)
    return 0
