"""A blob store in an S3 bucket (or anything speaking S3: MinIO, moto, ...) through boto3.

Transient failures (500/502/503/504, throttling, connection errors, timeouts) are
retried by botocore's ``standard`` retry mode within ``max_attempts``; after that the
caller gets a :class:`BlobError` that names the bucket and key. Writes are all-or-
nothing: a single PUT is atomic in S3, and a multipart upload is aborted if any part
or the completion fails, so no partial object and no dangling upload remain.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
    ReadTimeoutError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)

from sediment._s3 import NOT_FOUND_CODES as _NOT_FOUND_CODES
from sediment._s3 import Bucket, PreconditionFailed
from sediment._s3 import error_code as _error_code
from sediment._s3 import retries as _retries
from sediment._s3 import status as _status
from sediment.errors import BlobAlreadyExists, BlobCredentialsError, BlobError, BlobNotFound

from .keys import open_key, validate_range

log = logging.getLogger(__name__)

MIB = 1024 * 1024
MIN_PART_SIZE = 5 * MIB
"""S3 rejects non-final multipart parts smaller than this."""

T = TypeVar("T")

_CREDENTIAL_CODES = frozenset({"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
                               "InvalidToken"})


class S3BlobStore:
    """Objects under ``s3://bucket/prefix``; keys are relative to ``prefix``.

    ``endpoint_url`` overrides the endpoint (the engine option ``s3_endpoint``); when
    None, boto3 uses ``AWS_ENDPOINT_URL`` if set, else AWS itself. Credentials come
    from boto3's usual chain (environment, config files, instance roles).

    ``max_attempts`` counts every attempt of one request, the first included. Objects
    larger than ``multipart_threshold`` are uploaded in ``part_size`` parts (at least
    5 MiB, as S3 requires), ``multipart_concurrency`` at a time. A conditional PUT that
    S3 answers with 409 (a concurrent request conflicted) is retried ``conflict_attempts``
    times in all, backing off through ``sleep``.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        *,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        max_attempts: int = 5,
        multipart_threshold: int = 64 * MIB,
        part_size: int = 16 * MIB,
        multipart_concurrency: int = 4,
        addressing_style: str = "auto",
        conflict_attempts: int = 6,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not bucket:
            raise ValueError("S3 bucket name is empty; use s3://bucket/prefix")
        if part_size < MIN_PART_SIZE:
            raise ValueError(
                f"S3 part_size {part_size} is below S3's minimum of {MIN_PART_SIZE} bytes (5 MiB); raise it"
            )
        if max_attempts < 1:
            raise ValueError(f"S3 max_attempts must be >= 1 (the first attempt counts), got {max_attempts}")
        if multipart_concurrency < 1:
            raise ValueError(f"S3 multipart_concurrency must be >= 1, got {multipart_concurrency}")
        self._s3 = Bucket(bucket, prefix, endpoint_url, region, connect_timeout=connect_timeout,
                          read_timeout=read_timeout, max_attempts=max_attempts, conflict_attempts=conflict_attempts,
                          sleep=sleep, pool=max(10, multipart_concurrency + 2), addressing_style=addressing_style)
        self.bucket, self.prefix, self._client = bucket, self._s3.prefix, self._s3.client
        self.endpoint_url: str = self._s3.endpoint_url
        self.max_attempts = max_attempts
        self.multipart_threshold = multipart_threshold
        self.part_size = part_size
        self.multipart_concurrency = multipart_concurrency
        self.read_timeout = read_timeout
        self._closed = False

    def __repr__(self) -> str:
        return f"S3BlobStore(s3://{self.bucket}/{self.prefix}, endpoint={self.endpoint_url})"

    # --- error translation ------------------------------------------------------------------

    def _where(self, key: str) -> str:
        return f"key {key!r} (s3://{self.bucket}/{self.prefix}{key} at {self.endpoint_url})"

    def _hint(self, e: Exception) -> str:
        if isinstance(e, NoCredentialsError):
            return "no AWS credentials were found; set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a profile"
        if isinstance(e, ReadTimeoutError):
            return (
                f"the endpoint did not answer within the read timeout ({self.read_timeout} s) on any "
                "attempt; check its health or raise s3_read_timeout"
            )
        if isinstance(e, BotoConnectionError):
            return "the endpoint could not be reached; check s3_endpoint / AWS_ENDPOINT_URL and the network"
        if isinstance(e, ClientError):
            code = _error_code(e)
            if code in _CREDENTIAL_CODES:
                return "the credentials were refused; check the access key and the bucket policy"
            if code == "NoSuchBucket":
                return f"bucket {self.bucket!r} does not exist; create it or fix the URI"
            if _status(e) >= 500:
                return "the endpoint kept failing past the retry budget; retry later or raise s3_max_attempts"
        return "check the endpoint, credentials and bucket"

    def _fail(self, op: str, key: str, e: Exception, extra: str = "") -> BlobError:
        if isinstance(e, NoCredentialsError) or isinstance(e, ClientError) and _error_code(e) in _CREDENTIAL_CODES:
            what = f"{type(e).__name__}: {e}" if not isinstance(e, ClientError) else _error_code(e)
            return BlobCredentialsError(f"S3 {op} of {self._where(key)} refused, not retried: {what}. "
                                        f"{self._hint(e)}{extra}")
        if isinstance(e, ClientError):
            message = e.response.get("Error", {}).get("Message", "")
            what = f"{_error_code(e) or _status(e)}: {message}".rstrip(": ")
            attempts = f"{_retries(e) + 1} attempt(s)"
        else:
            what = f"{type(e).__name__}: {e}"
            attempts = f"up to {self.max_attempts} attempt(s)"
        return BlobError(
            f"S3 {op} of {self._where(key)} failed after {attempts}: {what}. "
            f"{self._hint(e)}{extra}"
        )

    def _call(self, op: str, key: str, fn: Callable[..., T], **kwargs: Any) -> T:
        """Run one client call, mapping a missing object to BlobNotFound and everything else to BlobError."""
        try:
            return fn(**kwargs)
        except ClientError as e:
            if _error_code(e) in _NOT_FOUND_CODES:
                raise BlobNotFound(f"no object at {self._where(key)}") from None
            raise self._fail(op, key, e) from e
        except BotoCoreError as e:
            raise self._fail(op, key, e) from e

    def _check(self, key: str) -> str:
        return self.prefix + open_key(self._closed, self._where(key), key)

    def _read_body(self, op: str, key: str, request: Callable[[], dict[str, Any]]) -> bytes:
        """Fetch and read a body, retrying the whole request if the body stream breaks mid-read.

        botocore retries only until the response headers arrive; a stalled or cut body
        surfaces later, in ``read()``, so that part is retried here within the same budget.
        """
        for attempt in range(1, self.max_attempts + 1):
            response = request()
            try:
                return response["Body"].read()
            except (HTTPClientError, IncompleteReadError) as e:
                if attempt == self.max_attempts:
                    raise self._fail(op, key, e) from e
                log.warning("S3 %s of %s: body read failed (%s); retrying", op, self._where(key), e)
            finally:
                response["Body"].close()
        raise AssertionError("unreachable")

    # --- reads -------------------------------------------------------------------------------

    def get(self, key: str) -> bytes:
        full = self._check(key)
        return self._read_body(
            "get",
            key,
            lambda: self._call("get", key, self._client.get_object, Bucket=self.bucket, Key=full),
        )

    def get_range(self, key: str, start: int, length: int) -> bytes:
        validate_range(key, start, length)
        full = self._check(key)
        if length == 0:
            self.size(key)
            return b""

        def request() -> dict[str, Any]:
            try:
                return self._client.get_object(
                    Bucket=self.bucket, Key=full, Range=f"bytes={start}-{start + length - 1}"
                )
            except ClientError as e:
                if _error_code(e) == "InvalidRange" or _status(e) == 416:
                    return {"Body": _Empty()}
                raise

        return self._read_body("get_range", key, lambda: self._call("get_range", key, request))

    def size(self, key: str) -> int:
        full = self._check(key)
        head = self._call("size", key, self._client.head_object, Bucket=self.bucket, Key=full)
        return int(head["ContentLength"])

    # --- writes ------------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> None:
        full = self._check(key)
        if len(data) > self.multipart_threshold:
            self._put_multipart(key, full, data)
            return
        self._call("put", key, self._client.put_object, Bucket=self.bucket, Key=full, Body=bytes(data))

    def put_if_absent(self, key: str, data: bytes) -> None:
        """Create the object with a conditional PUT (``If-None-Match: *``).

        A 409 (concurrent conditional request) is retried, never taken as existence. If an
        earlier attempt of this very call landed but its answer was lost, the retry sees 412. In that case (and only after a retry) the stored bytes are compared with
        ``data``: equal bytes mean this call created the object. Callers using
        put_if_absent as a lock must therefore write bytes unique to the writer.
        """
        full = self._check(key)
        data = bytes(data)
        try:
            self._s3.put_conditional(Key=full, Body=data, IfNoneMatch="*")
        except PreconditionFailed as e:
            if e.retried and self._holds(key, data):
                log.info("S3 put_if_absent of %s: an earlier attempt of this call landed", full)
                return
            raise BlobAlreadyExists(
                f"an object already exists at {self._where(key)}; put_if_absent never replaces one"
            ) from None
        except (ClientError, BotoCoreError) as e:
            raise self._fail("put_if_absent", key, e) from e

    def _holds(self, key: str, data: bytes) -> bool:
        try:
            return self.get(key) == data
        except BlobNotFound:
            return False

    def _put_multipart(self, key: str, full: str, data: bytes) -> None:
        created = self._call(
            "put (create multipart upload)",
            key,
            self._client.create_multipart_upload,
            Bucket=self.bucket,
            Key=full,
        )
        upload_id = created["UploadId"]
        view = memoryview(data)
        offsets = range(0, len(data), self.part_size)

        def upload(number: int, offset: int) -> dict[str, Any]:
            part = self._client.upload_part(
                Bucket=self.bucket,
                Key=full,
                UploadId=upload_id,
                PartNumber=number,
                Body=bytes(view[offset : offset + self.part_size]),
            )
            return {"PartNumber": number, "ETag": part["ETag"]}

        try:
            if self.multipart_concurrency == 1:
                parts = list(map(upload, itertools.count(1), offsets))
            else:  # Executor.map cancels the parts not yet started once one fails
                with ThreadPoolExecutor(self.multipart_concurrency, thread_name_prefix="s3-part") as pool:
                    parts = list(pool.map(upload, itertools.count(1), offsets))
            self._client.complete_multipart_upload(
                Bucket=self.bucket, Key=full, UploadId=upload_id, MultipartUpload={"Parts": parts}
            )
        except (ClientError, BotoCoreError) as e:
            raise self._fail("put (multipart)", key, e, self._abort(key, full, upload_id)) from e
        except BaseException:
            self._abort(key, full, upload_id)
            raise

    def _abort(self, key: str, full: str, upload_id: str) -> str:
        """Abort a failed upload; returns a note for the error message if even that failed."""
        try:
            self._client.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload_id)
        except (ClientError, BotoCoreError) as e:
            why = _error_code(e) if isinstance(e, ClientError) else type(e).__name__
            if why == "NoSuchUpload":
                return ""
            log.error("S3 abort of multipart upload %s of %s failed: %s", upload_id, self._where(key), e)
            return (
                f" Aborting multipart upload {upload_id} also failed ({why}); no object was "
                "created, but abort it by hand or set a bucket lifecycle rule AbortIncompleteMultipartUpload."
            )
        return ""

    def delete(self, key: str) -> None:
        full = self._check(key)
        with contextlib.suppress(BlobNotFound):
            self._call("delete", key, self._client.delete_object, Bucket=self.bucket, Key=full)

    def list(self, prefix: str = "") -> list[str]:
        if self._closed:
            raise BlobError(
                f"list of prefix {prefix!r} in s3://{self.bucket}/{self.prefix}: "
                "the store is closed; open a new one"
            )
        keys: list[str] = []
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.prefix + prefix
            )
            for page in pages:
                keys.extend(obj["Key"][len(self.prefix) :] for obj in page.get("Contents", ()))
        except (ClientError, BotoCoreError) as e:
            raise self._fail("list", f"{prefix}*", e) from e
        return sorted(keys)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._client.close()


class _Empty:
    """Body of a range read that starts past the end of the object."""

    def read(self) -> bytes:
        return b""

    def close(self) -> None:
        pass
