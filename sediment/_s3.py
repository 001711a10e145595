"""S3 helpers shared by the blob store (blob/s3.py), the metadata store (metadata/s3.py)
and the log on S3 (wal/s3_objects.py): the boto3 client's configuration, the reading of
error answers, and a bucket under a prefix whose conditional PUT retries S3's 409. Kept below every layer, beside
``sediment._fs``, so the metadata package stays a leaf."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import boto3
import botocore.loaders
import botocore.session
from botocore.config import Config
from botocore.exceptions import ClientError

log = logging.getLogger(__name__)

NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
EXISTS_CODES = frozenset({"PreconditionFailed", "412"})
CONFLICT_CODES = frozenset({"ConditionalRequestConflict", "409"})


def error_code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def status(e: ClientError) -> int:
    return int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def retries(e: ClientError) -> int:
    """How many times botocore resent the request before this answer."""
    return int(e.response.get("ResponseMetadata", {}).get("RetryAttempts", 0) or 0)


def is_missing(e: ClientError) -> bool:
    return error_code(e) in NOT_FOUND_CODES


def is_precondition_failed(e: ClientError) -> bool:
    """412: the condition (``If-None-Match: *`` or ``If-Match``) did not hold."""
    return error_code(e) in EXISTS_CODES or status(e) == 412


def is_conditional_conflict(e: ClientError) -> bool:
    """409 ConditionalRequestConflict: a concurrent request on the key won; retry, the key may be absent."""
    return error_code(e) in CONFLICT_CODES or status(e) == 409


def make_client(endpoint_url: str | None, region: str, *, connect_timeout: float, read_timeout: float,
                max_attempts: int, pool: int = 10, addressing_style: str = "auto") -> Any:
    """A boto3 S3 client with botocore's ``standard`` retries (5xx, throttling, timeouts,
    dropped connections) within ``max_attempts`` attempts, the first included."""
    config = Config(
        region_name=region,
        retries={"mode": "standard", "total_max_attempts": max_attempts},
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        max_pool_connections=pool,
        s3={"addressing_style": addressing_style},
    )
    with _CLIENTS:
        core = botocore.session.Session()
        core.register_component("data_loader", _LOADER)
        return boto3.session.Session(botocore_session=core).client("s3", endpoint_url=endpoint_url, config=config)


def warm() -> None:
    """Parse the S3 service model now (a cluster member at start-up), so that the first
    partition it takes over does not pay for it during a failover."""
    make_client(None, "us-east-1", connect_timeout=1, read_timeout=1, max_attempts=1)


# botocore parses its service models (a few MB of JSON) once per loader: one loader for the
# process spares each new client that (about 0.2 s, a third of a cluster partition's open).
_LOADER = botocore.loaders.create_loader()
_CLIENTS = threading.Lock()  # boto3 sessions are not thread-safe while they build clients


class PreconditionFailed(Exception):
    """A conditional PUT answered 412; ``retried`` says whether an earlier attempt of the same
    call may have landed (botocore resent it, or a 409 was retried), so the caller must
    compare the stored bytes with its own before calling it a lost race."""

    def __init__(self, retried: bool) -> None:
        super().__init__("precondition failed")
        self.retried = retried


class Bucket:
    """A bucket under a key prefix, reached through one client: where the S3 blob store, the
    S3 metadata store and the log on S3 keep their objects, and how each of them writes one
    conditionally (``conflict_attempts`` tries in all, paced by ``sleep``)."""

    def __init__(self, bucket: str, prefix: str, endpoint_url: str | None, region: str, *, connect_timeout: float,
                 read_timeout: float, max_attempts: int, conflict_attempts: int, sleep: Callable[[float], None],
                 pool: int = 10, addressing_style: str = "auto") -> None:
        prefix = prefix.strip("/")
        self.name = bucket
        self.prefix = prefix + "/" if prefix else ""
        self.client = make_client(endpoint_url, region, connect_timeout=connect_timeout, read_timeout=read_timeout,
                                  max_attempts=max_attempts, pool=pool, addressing_style=addressing_style)
        self.endpoint_url: str = self.client.meta.endpoint_url
        self.conflict_attempts = max(1, conflict_attempts)
        self.sleep = sleep

    def put_conditional(self, **kwargs: Any) -> None:
        """One conditional PutObject, retrying S3's 409 ConditionalRequestConflict.

        botocore never retries a 409, and a 409 is no proof the condition failed: it means a
        concurrent request on the key conflicted. So it is retried here, ``conflict_attempts``
        times in all, with exponential backoff. A 412 raises :class:`PreconditionFailed`; any
        other error propagates unchanged.
        """
        for attempt in range(1, self.conflict_attempts + 1):
            try:
                self.client.put_object(Bucket=self.name, **kwargs)
                return
            except ClientError as e:
                if is_precondition_failed(e):
                    raise PreconditionFailed(retried=retries(e) > 0 or attempt > 1) from None
                if not is_conditional_conflict(e) or attempt == self.conflict_attempts:
                    raise
                log.info("S3 conditional PUT of %s: 409 conflict, retrying (%d/%d)", kwargs.get("Key"), attempt,
                         self.conflict_attempts)
                self.sleep(min(1.0, 0.02 * 2 ** (attempt - 1)))
        raise AssertionError("unreachable")


def read_object(client: Any, bucket: str, key: str) -> bytes | None:
    """The object's bytes, or None when S3 says it does not exist. Every other failure
    (ClientError, BotoCoreError) is the caller's to type, with its own where and what to do."""
    try:
        response = client.get_object(Bucket=bucket, Key=key)
    except ClientError as e:
        if is_missing(e):
            return None
        raise
    try:
        return response["Body"].read()
    finally:
        response["Body"].close()
