"""The data source's connection to a cluster of coordinators (issue 29).

A Spark job keeps state at one coordinator between its calls: a write's transactions and
their group (begun in the tasks, committed by the driver with ``commit_all``), a read's
lease and held tail parts, a bulk load's staging directory. Over a cluster that state lives
at the member serving the relation's partition, so every call of a job for one relation
goes to that member: :func:`connect_for` resolves the owner (through ZooKeeper for
``zk://HOST:PORT/NAME``, through the S3 metadata store for an S3-only cluster's
``s3://BUCKET/PREFIX[?endpoint=URL]``, or by following a member's redirects for its
``grpc://`` address) and returns a plain client of it, which also places the relations it creates (a stream
sink's progress relation) in that partition, so a micro-batch's data and its progress mark
commit together. A job over several relations therefore commits per partition.

If the partition moves while the job runs, the old owner refuses the job's calls
(NotPartitionOwner, or a transaction it no longer holds): the task or the job fails with
nothing of it committed, and a retry connects to the new owner.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from sediment.client import Client


class PartitionClient(Client):
    """A client of the member serving ``partition``: today's client, except that a relation
    it creates goes into that partition unless another is named."""

    def __init__(self, uri: str, token: str | None, partition: int) -> None:
        super().__init__(uri, token)
        self.partition = partition

    def add_relation(self, name: str, schema: pa.Schema, *, partition: int | None = None) -> None:
        super().add_relation(name, schema, partition=self.partition if partition is None else partition)


def connect_for(uri: str, token: str | None, relation: str | None) -> Any:
    """A client for the calls of one job about ``relation``: for a single coordinator, its
    client; for a cluster (a ``zk://`` or ``s3://`` URI, or a member's address), a :class:`PartitionClient`
    of the member serving the relation's partition (the cluster client itself when no
    relation is named)."""
    import sediment

    client = sediment.connect(uri, token)
    if isinstance(client, Client) or relation is None:
        return client
    try:
        address, partition = client.owner(relation)
    finally:
        client.close()
    return PartitionClient(address, token, partition)
