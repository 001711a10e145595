"""Cluster membership on ZooKeeper (the layout of ``cluster/layout.py``).

A member registers an ephemeral sequential znode ``members/m-<seq>``: the lowest sequence is
the manager, and the znode goes when the session ends. Watches wake the member's control
loop. The assignment is written with the znode's version as compare-and-set.

kazoo queues a call made while the connection is suspended until it is back (for a
SIGSTOPped ZooKeeper, for ever), so the calls a client's request waits on are made
asynchronously and waited for at most ``ZK_CALL_TIMEOUT`` seconds: CallUnanswered after it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from sediment.cluster import layout
from sediment.cluster.membership import CallUnanswered

ZK_CALL_TIMEOUT = 5.0  # seconds a ZooKeeper call made for a client's request (or a leave) waits at most
log = logging.getLogger(__name__)


class ZooKeeperMembership:
    """The membership of the cluster at ``where`` (``zk://HOST:PORT/NAME``)."""

    def __init__(self, where: layout.ClusterPath) -> None:
        self.where = where
        self.uri = where.uri
        self.store, self.tie = "ZooKeeper", "ZooKeeper session"
        self.config: layout.ClusterConfig | None = None
        self._zk: Any = None

    def start(self, on_state: Callable[[str], None]) -> layout.ClusterConfig:
        probe = layout.connect_zk(self.where)
        try:
            self.config = layout.read_config(probe, self.where)
        finally:
            probe.stop()
            probe.close()
        self._zk = layout.connect_zk(self.where, timeout=self.config.session_timeout)
        self._zk.add_listener(on_state)
        self._zk_timeout = self._zk.handler.timeout_exception
        return self.config

    def stop(self) -> None:
        if self._zk is None:
            return
        try:
            self._zk.stop()  # bounded by kazoo (the session timeout, at least 10 s)
        finally:
            self._zk.close()

    def _bounded(self, result: Any) -> Any:
        from kazoo.exceptions import ConnectionClosedError, ConnectionLoss, SessionExpiredError

        try:
            return result.get(timeout=ZK_CALL_TIMEOUT)
        except (self._zk_timeout, ConnectionLoss, SessionExpiredError, ConnectionClosedError) as exc:
            raise CallUnanswered(f"no answer within {ZK_CALL_TIMEOUT:g} s" if isinstance(exc, self._zk_timeout)
                                 else type(exc).__name__) from None

    # --- membership ------------------------------------------------------------------------------

    def register(self, advertise: str) -> str:
        path = self._zk.create(self.where.path("members", "m-"), json.dumps({"advertise": advertise}).encode(),
                               ephemeral=True, sequence=True)
        return path.rsplit("/", 1)[1]

    def members(self, wake: Callable[[], None]) -> list[str]:
        return self._zk.get_children(self.where.path("members"), watch=lambda _event=None: wake())

    def remove(self, member: str) -> None:
        from kazoo.exceptions import NoNodeError

        try:
            self._zk.delete(self.where.path("members", member))
        except NoNodeError:
            pass

    def leaving(self, wake: Callable[[], None]) -> list[str]:
        return self._zk.get_children(self.where.path("leaving"), watch=lambda _event=None: wake())

    def announce_leaving(self, member: str) -> None:
        self._bounded(self._zk.create_async(self.where.path("leaving", member), b"", ephemeral=True))

    def read_assignment(self, wake: Callable[[], None]) -> tuple[bytes, Any]:
        from kazoo.exceptions import NoNodeError

        try:
            return self._zk.get(self.where.path("assignment"), watch=lambda _event=None: wake())
        except NoNodeError:
            return b"", None

    def write_assignment(self, data: bytes, version: Any) -> bool:
        from kazoo.exceptions import BadVersionError, NodeExistsError

        try:
            if version is None:
                self._zk.create(self.where.path("assignment"), data)
            else:
                self._zk.set(self.where.path("assignment"), data, version=version.version)
        except (BadVersionError, NodeExistsError):
            return False
        return True

    def assignment_now(self) -> dict[int, tuple[str, int]]:
        """``sync``, then ``get``: the server this session reads from catches up with the
        leader before it answers. Both are sent at once (a session's requests are served in
        order), so the confirmation costs one round trip."""
        from kazoo.exceptions import NoNodeError

        path = self.where.path("assignment")
        synced, got = self._zk.sync_async(path), self._zk.get_async(path)
        self._bounded(synced)
        try:
            data, _stat = self._bounded(got)
        except NoNodeError:
            return {}
        return layout.decode_assignment(data)

    def read_view(self) -> dict:
        return layout.read_view(self._zk, self.where)

    def fresh(self, heard_age: float) -> bool:
        """Read within half the session timeout ZooKeeper granted (which may be less than the
        one asked): a process resumed after a pause refuses before kazoo notices."""
        return heard_age < layout.granted_timeout(self._zk, self.config.session_timeout) / 2

    def engine_options(self, partition: int) -> dict[str, Any]:
        cfg = self.config
        return {"metadata": self.where.partition_metadata(partition), "replicas": list(cfg.replicas),
                "cluster_key": cfg.cluster_key, "log_partition": partition,
                "blob": layout.partition_blob(cfg.blob, partition), "s3_endpoint": cfg.s3_endpoint}

    # --- relations -------------------------------------------------------------------------------

    def record_relation(self, name: str, partition: int) -> tuple[int, bool]:
        from kazoo.exceptions import NodeExistsError, NoNodeError

        path = self.where.path("relations", name)
        while True:
            try:
                self._bounded(self._zk.create_async(path, str(partition).encode()))
                return partition, True
            except NodeExistsError:
                pass
            try:
                value, _stat = self._bounded(self._zk.get_async(path))
                return int(value), False
            except NoNodeError:
                continue  # dropped meanwhile: record it again

    def relation(self, name: str) -> tuple[int, Any] | None:
        from kazoo.exceptions import NoNodeError

        try:
            value, stat = self._bounded(self._zk.get_async(self.where.path("relations", name)))
        except NoNodeError:
            return None
        return int(value), stat.czxid

    def remove_relation(self, name: str, record: Any = None) -> None:
        from kazoo.exceptions import NoNodeError

        path = self.where.path("relations", name)
        try:
            if record is not None:
                _value, now = self._bounded(self._zk.get_async(path))
                if now.czxid != record:
                    return  # dropped and added again meanwhile (by a newer owner): that relation stays
            self._bounded(self._zk.delete_async(path))
        except NoNodeError:  # already gone
            pass

    def relation_names(self) -> list[str]:
        return self._bounded(self._zk.get_children_async(self.where.path("relations")))
