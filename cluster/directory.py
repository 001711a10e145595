"""Where clients and ``cluster status`` read a cluster's members, assignment and relations:
ZooKeeper for ``zk://``, the cluster's S3 metadata store for ``s3://``. Reads only; a
client never joins nor judges liveness (a member it cannot reach it skips)."""

from __future__ import annotations

from typing import Any

from sediment.cluster import layout, s3_layout


def parse_cluster(uri: str) -> Any:
    """A parsed cluster URI: ``layout.ClusterPath`` (zk://) or ``s3_layout.S3ClusterPath`` (s3://)."""
    if isinstance(uri, str) and uri.startswith(s3_layout.SCHEME):
        return s3_layout.S3ClusterPath.parse(uri)
    return layout.ClusterPath.parse(uri)


def is_cluster_uri(uri: object) -> bool:
    return isinstance(uri, str) and (uri.startswith(layout.SCHEME) or uri.startswith(s3_layout.SCHEME))


class Directory:
    """The cluster's state as stored, for reading: :meth:`read_view` as ``layout.read_view``."""

    def __init__(self, uri: str) -> None:
        self.where = parse_cluster(uri)
        self.zk: Any = None  # zk://: the kazoo client
        self._s3: Any = None
        if isinstance(self.where, s3_layout.S3ClusterPath):
            self._s3 = s3_layout.open_store(self.where)
            try:
                self.config = s3_layout.read_config(self._s3, self.where)  # ClusterMissing now
            except BaseException:
                self._s3.close()
                raise
        else:
            self.zk = layout.connect_zk(self.where)
            try:
                self.config = layout.read_config(self.zk, self.where)
            except BaseException:
                self.close()
                raise

    def read_view(self, timeout: float | None = None) -> dict:
        """Each read waits at most ``timeout`` seconds on ZooKeeper; S3's reads are bounded by
        the store's own timeouts."""
        if self._s3 is not None:
            return s3_layout.read_view(self._s3)
        return layout.read_view(self.zk, self.where, timeout)

    def close(self) -> None:
        if self.zk is not None:
            self.zk.stop()
            self.zk.close()
            self.zk = None
        if self._s3 is not None:
            self._s3.close()
            self._s3 = None
