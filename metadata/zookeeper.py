"""Metadata in ZooKeeper: for replicated deployments that already run a ZooKeeper.

Each key is a znode under ``root``; compare-and-set is ZooKeeper's conditional
``create``/``set``/``delete`` on the znode version. Two details make ZooKeeper's tree
behave like the flat, versioned key space of :class:`MetadataStore`:

* Znodes created only as parents of a key (and keys deleted while they still have
  children) hold empty data; a key's znode always starts with a 13-byte header, so
  intermediate znodes are never reported as keys and ``get`` returns None for them.
* When an intermediate znode becomes a key, its znode version is already above 0.
  The header records that znode version as the key's *base*, and the key's version is
  ``znode version - base``, so every key starts at version 0 as the protocol says.

The header also carries a random per-call write id. A write whose reply is lost with
the connection is retried with the same id; if the retry finds the id already stored,
the first attempt succeeded, so a lost reply never turns into a false conflict.

Every call is bounded by ``timeout``: when ZooKeeper cannot be reached, calls raise
MetadataUnavailable instead of hanging. ``session_lost`` reports a lost session (after
which ephemeral state and any fencing assumptions are void). Layout in
docs/formats.md ("Metadata store formats").
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.recipe.watchers import DataWatch
from kazoo.retry import KazooRetry

from sediment.errors import (
    EngineClosed,
    InvalidMetadataRequest,
    MetadataCorruption,
    MetadataError,
    MetadataUnavailable,
)
from sediment.metadata import validation as valid
from sediment.metadata.protocol import Versioned

KEY_NODE_TAG = 0x01
_KEY_HEADER = struct.Struct(">BI8s")  # tag, base znode version, write id
KEY_HEADER_SIZE = _KEY_HEADER.size

_TRANSIENT = (ConnectionLoss, SessionExpiredError, OperationTimeoutError)

T = TypeVar("T")
log = logging.getLogger(__name__)
# kazoo warns once per failed attempt; with no logging set up, Python's fallback printed dozens
# of lines before sediment's one typed error. Set-up logging still gets them.
logging.getLogger("kazoo").addHandler(logging.NullHandler())


class _Retry(Exception):
    """Internal: the znode changed between our read and conditional write; go again."""


def encode_key_node(value: bytes, base: int, write_id: bytes) -> bytes:
    """The data of a key's znode (exposed for the format docs and tests)."""
    return _KEY_HEADER.pack(KEY_NODE_TAG, base, write_id) + value


def _decode(path: str, data: bytes) -> tuple[int, bytes, bytes] | None:
    """(base, write id, value) for a key znode, None for an intermediate znode."""
    if not data:
        return None
    if data[0] != KEY_NODE_TAG or len(data) < KEY_HEADER_SIZE:
        raise MetadataCorruption(
            f"znode {path} holds {len(data)} bytes that are not a sediment key (first byte "
            f"{data[0]:#04x}); something else writes under this root, use a dedicated root"
        )
    _, base, write_id = _KEY_HEADER.unpack_from(data, 0)
    return base, write_id, bytes(data[KEY_HEADER_SIZE:])


ATTEMPTS_PER_SESSION = 3  # connection attempts a handshake that is never answered may cost, per session timeout


def attempt_hosts(hosts: str) -> list[str]:
    """The server list handed to kazoo: ``hosts`` repeated so it has ATTEMPTS_PER_SESSION entries.

    kazoo gives each connection attempt the session timeout divided by the number of
    entries to complete its handshake. With one server a handshake that is accepted and
    never answered (ZooKeeper 3.8 leaves a connection it took while starting open and
    silent) cost the whole session timeout: the client tried again only once the
    restarted server had expired its session. Repeated entries bound an attempt to a
    third of the session, so the next attempt, on the same server, still finds it."""
    servers, _, chroot = hosts.partition("/")
    entries = [h for h in servers.split(",") if h.strip()]
    if not entries:
        raise InvalidMetadataRequest(f"no ZooKeeper host in {hosts!r}; use HOST:PORT[,HOST:PORT...][/chroot]")
    repeat = -(-ATTEMPTS_PER_SESSION // max(len(entries), 1))
    return entries * repeat + ([f"/{chroot}"] if chroot else [])


class QuietUntilConnected(logging.Filter):
    """Demotes kazoo's warnings to debug until the client first connects: a ZooKeeper that is
    not there gave a warning per attempt (about 40 lines in 10 s) before the one-line error
    that says so. Once connected, a lost connection is worth its warnings again."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__()
        self.connected = False
        self._logger = logger

    def filter(self, record: logging.LogRecord) -> bool:
        if self.connected or record.levelno < logging.WARNING:
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return self._logger.isEnabledFor(logging.DEBUG)


def kazoo_logger() -> tuple[logging.Logger, QuietUntilConnected]:
    """A logger of one kazoo client's own (under ``kazoo.client``, so its handlers apply), and
    its filter: set ``connected`` once the client's first start succeeded."""
    base = logging.getLogger("kazoo.client")
    logger = logging.Logger(base.name)
    logger.parent = base
    quiet = QuietUntilConnected(logger)
    logger.addFilter(quiet)
    return logger, quiet


def connection_retry() -> KazooRetry:
    """How a kazoo client reconnects: at most a second between attempts, for ever. Kazoo's
    default doubles the wait up to an hour, so a client back from a long outage would stay
    disconnected about as long again after ZooKeeper returned."""
    return KazooRetry(max_tries=-1, delay=0.1, max_delay=1.0)


class ZooKeeperMetadataStore:
    """A :class:`~sediment.metadata.protocol.MetadataStore` over ZooKeeper znodes."""

    def __init__(
        self,
        hosts: str = "127.0.0.1:2181",
        root: str = "/sediment",
        timeout: float = 10.0,
        *,
        session_timeout: float = 10.0,
        on_session_lost: Callable[[], None] | None = None,
    ) -> None:
        root = root.rstrip("/")
        if not root.startswith("/") or not root or "//" in root:
            raise InvalidMetadataRequest(
                f"ZooKeeper root {root!r} must be an absolute znode path like '/sediment' (not '/')"
            )
        self.hosts = hosts
        self.root = root
        self.timeout = timeout
        self._closed = False
        self._session_lost = False
        self._lost_callbacks: list[Callable[[], None]] = []
        if on_session_lost is not None:
            self._lost_callbacks.append(on_session_lost)
        self._connected = threading.Event()
        logger, quiet = kazoo_logger()
        self._client = KazooClient(
            hosts=attempt_hosts(hosts),
            timeout=session_timeout,
            connection_retry=connection_retry(),
            logger=logger,
        )
        self._client.add_listener(self._on_state)
        try:
            self._client.start(timeout=timeout)
        except Exception as exc:
            self._client.close()
            raise MetadataUnavailable(
                f"cannot connect to ZooKeeper at {hosts} within {timeout}s ({exc!r}); check that "
                "the servers are running and reachable"
            ) from exc
        quiet.connected = True
        self._connected.set()
        self._session_id = self._client.client_id[0] if self._client.client_id else None
        try:
            self._run(
                lambda deadline: self._call(
                    lambda: self._client.ensure_path_async(self.root), deadline, f"create root {self.root}"
                ),
                f"create root {self.root}",
            )
        except BaseException:
            self.close()
            raise

    # --- session state ---------------------------------------------------------------------

    def _on_state(self, state: str) -> None:
        if state == KazooState.CONNECTED:
            self._connected.set()
        else:
            self._connected.clear()
        if state == KazooState.LOST and not self._closed:
            self._session_lost = True
            for callback in list(self._lost_callbacks):
                with contextlib.suppress(Exception):
                    callback()

    @property
    def session_lost(self) -> bool:
        """True once the ZooKeeper session expired or was closed from elsewhere (sticky).

        kazoo reconnects with a new session afterwards and calls keep working, but
        anything that relied on the old session (ephemeral znodes, being the current
        coordinator) must be re-established: the replication layer fences on this.
        """
        return self._session_lost

    def wait_connected(self, timeout: float) -> bool:
        """Block until the client has a live connection (True) or ``timeout`` passed (False)."""
        return self._connected.wait(timeout)

    @property
    def session_id(self) -> int | None:
        """The session id this store started with."""
        return self._session_id

    def add_session_lost_listener(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` (from kazoo's thread; must not block) when the session is lost."""
        self._lost_callbacks.append(callback)

    def watch(self, key: str, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` (from kazoo's thread; must not block) whenever ``key`` changes,
        is created or deleted, and once when the watch is set: what lets a coordinator hear
        at once that another one took its partition, instead of at its next write. Returns
        a function that cancels the watch. ZooKeeper re-arms it after each change and after
        a reconnect."""
        valid.validate_key(key)
        cancelled = threading.Event()

        def changed(_data: object, _stat: object, _event: object = None) -> bool:
            if cancelled.is_set() or self._closed:
                return False  # kazoo stops watching on False
            try:
                callback()
            except Exception:  # noqa: BLE001 - a listener's failure must not end the watch
                log.exception("the watch callback on %s failed", key)
            return True

        DataWatch(self._client, self._path(key), changed)
        return cancelled.set

    # --- plumbing --------------------------------------------------------------------------

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}"

    def _unavailable(self, what: str, cause: object, outcome_unknown: bool = False) -> MetadataUnavailable:
        tail = (
            " The write may or may not have been applied: re-read the key before retrying."
            if outcome_unknown
            else ""
        )
        return MetadataUnavailable(
            f"ZooKeeper at {self.hosts} did not answer within {self.timeout}s while trying to "
            f"{what} ({cause!r}); check the ZooKeeper servers.{tail}"
        )

    def _call(self, start: Callable[[], Any], deadline: float, what: str) -> Any:
        """One kazoo async call bounded by ``deadline``; waits for a connection first."""
        if self._closed:
            raise EngineClosed(f"ZooKeeper metadata store {self.hosts}{self.root} was closed")
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not self._connected.wait(remaining):
            raise self._unavailable(what, "not connected")
        try:
            return self._wait(start(), deadline, what)
        except ConnectionClosedError as exc:
            raise EngineClosed(f"ZooKeeper metadata store {self.hosts}{self.root} was closed") from exc

    def _run(self, op: Callable[[float], T], what: str, write: bool = False) -> T:
        """Run ``op`` (which calls ``self._call``) until it succeeds or the deadline passes.

        Retries on connection loss and on _Retry (lost races on intermediate znodes).
        """
        deadline = time.monotonic() + self.timeout
        uncertain = False
        while True:
            try:
                return op(deadline)
            except _Retry:
                continue
            except _TRANSIENT as exc:
                uncertain = write
                if time.monotonic() >= deadline:
                    raise self._unavailable(what, exc, outcome_unknown=uncertain) from exc
                self._connected.wait(max(deadline - time.monotonic(), 0))
            except MetadataUnavailable as exc:
                if uncertain:
                    raise self._unavailable(what, exc, outcome_unknown=True) from exc
                raise
            except MetadataError:
                raise
            except KazooException as exc:
                raise MetadataError(f"ZooKeeper at {self.hosts} refused to {what}: {exc!r}") from exc

    def _conditional(self, start: Callable[[], Any], deadline: float, what: str) -> None:
        """A write conditional on a znode version: a lost race (the version moved, the znode
        went) makes the whole operation go round again."""
        try:
            self._call(start, deadline, what)
        except (BadVersionError, NoNodeError) as exc:
            raise _Retry() from exc

    def _get_node(self, path: str, deadline: float) -> tuple[tuple[int, bytes, bytes] | None, Any] | None:
        """(decoded, stat) of ``path``, or None when the znode does not exist."""
        try:
            data, stat = self._call(lambda: self._client.get_async(path), deadline, f"read {path}")
        except NoNodeError:
            return None
        return _decode(path, data), stat

    # --- the protocol ----------------------------------------------------------------------

    def get(self, key: str) -> Versioned | None:
        valid.validate_key(key)
        path = self._path(key)

        def op(deadline: float) -> Versioned | None:
            found = self._get_node(path, deadline)
            if found is None or found[0] is None:
                return None
            (base, _, value), stat = found
            return Versioned(value, stat.version - base)

        return self._run(op, f"read {path}")

    def compare_and_set(self, key: str, value: bytes, expected_version: int | None) -> int:
        valid.validate_key(key)
        valid.validate_expected(key, expected_version)
        value = valid.validate_value(key, value)
        path = self._path(key)
        where = f"znode {path} on {self.hosts}"
        write_id = os.urandom(8)

        def create(deadline: float) -> int:
            try:
                self._call(
                    lambda: self._client.create_async(
                        path, encode_key_node(value, 0, write_id), makepath=True
                    ),
                    deadline,
                    f"create {path}",
                )
                return 0
            except NodeExistsError:
                pass
            except NoNodeError as exc:
                raise _Retry() from exc
            found = self._get_node(path, deadline)
            if found is None:
                raise _Retry()
            decoded, stat = found
            if decoded is None:
                data = encode_key_node(value, stat.version + 1, write_id)
                self._conditional(lambda: self._client.set_async(path, data, version=stat.version), deadline,
                                  f"set {path}")
                return 0
            base, stored_id, _ = decoded
            if stored_id == write_id:
                return stat.version - base
            return valid.next_version(key, stat.version - base, None, where)  # raises: the key exists

        def update(deadline: float) -> int:
            found = self._get_node(path, deadline)
            if found is None or found[0] is None:
                return valid.next_version(key, None, expected_version, where)  # raises: the key is absent
            (base, stored_id, _), stat = found
            if stored_id == write_id:
                return stat.version - base
            version = valid.next_version(key, stat.version - base, expected_version, where)
            data = encode_key_node(value, base, write_id)
            self._conditional(lambda: self._client.set_async(path, data, version=stat.version), deadline,
                              f"set {path}")
            return version

        op = create if expected_version is None else update
        return self._run(op, f"write {path}", write=True)

    def delete(self, key: str, expected_version: int | None = None) -> None:
        valid.validate_key(key)
        valid.validate_expected(key, expected_version)
        path = self._path(key)
        attempted = [False]

        def op(deadline: float) -> None:
            found = self._get_node(path, deadline)
            if found is None or found[0] is None:
                if expected_version is None or attempted[0]:
                    return
                valid.check_delete(key, None, expected_version, f"znode {path} on {self.hosts}")  # raises
                return
            (base, _, _), stat = found
            valid.check_delete(key, stat.version - base, expected_version, f"znode {path} on {self.hosts}")
            attempted[0] = True
            try:
                self._call(
                    lambda: self._client.delete_async(path, version=stat.version), deadline, f"delete {path}"
                )
            except NotEmptyError:
                self._conditional(lambda: self._client.set_async(path, b"", version=stat.version), deadline,
                                  f"clear {path}")
                return
            except (BadVersionError, NoNodeError) as exc:
                raise _Retry() from exc
            self._prune_parents(path, deadline)

        self._run(op, f"delete {path}", write=True)

    def _prune_parents(self, path: str, deadline: float) -> None:
        """Remove now-empty intermediate znodes above a deleted key (best effort)."""
        parent = path.rsplit("/", 1)[0]
        while len(parent) > len(self.root):
            found = self._get_node(parent, deadline)
            if found is None or found[0] is not None or found[1].numChildren:
                return
            try:
                self._call(
                    lambda p=parent, v=found[1].version: self._client.delete_async(p, version=v),
                    deadline,
                    f"delete {parent}",
                )
            except (NotEmptyError, BadVersionError, NoNodeError):
                return
            parent = parent.rsplit("/", 1)[0]

    def list(self, prefix: str) -> list[str]:
        valid.validate_prefix(prefix)
        if "/" in prefix:
            directory, partial = prefix.rsplit("/", 1)
            start = self._path(directory)
            rel = directory + "/"
        else:
            start, partial, rel = self.root, prefix, ""

        def op(deadline: float) -> list[str]:
            keys: list[str] = []
            try:
                children = self._call(
                    lambda: self._client.get_children_async(start), deadline, f"list {start}"
                )
            except NoNodeError:
                return []
            level = [(f"{start}/{c}", f"{rel}{c}") for c in children if c.startswith(partial)]
            while level:
                reads = [(path, k, self._client.get_async(path)) for path, k in level]
                kids = [(path, k, self._client.get_children_async(path)) for path, k in level]
                for path, k, result in reads:
                    try:
                        data, _ = self._wait(result, deadline, f"read {path}")
                    except NoNodeError:
                        continue
                    if _decode(path, data) is not None:
                        keys.append(k)
                level = []
                for path, k, result in kids:
                    try:
                        names = self._wait(result, deadline, f"list {path}")
                    except NoNodeError:
                        continue
                    level.extend((f"{path}/{c}", f"{k}/{c}") for c in names)
            return sorted(keys)

        return self._run(op, f"list {self.root}/{prefix}*")

    def _wait(self, result: Any, deadline: float, what: str) -> Any:
        try:
            return result.get(timeout=max(deadline - time.monotonic(), 0.001))
        except self._client.handler.timeout_exception as exc:
            raise self._unavailable(what, exc) from exc

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._client.stop()
        finally:
            self._client.close()

    def __enter__(self) -> ZooKeeperMetadataStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
