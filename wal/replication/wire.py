"""The storage-node wire protocol: framed, versioned, checksummed messages (pure; no sockets).

Every message is one frame: a 16-byte header (``FRAME``), then a request (``REQUEST``) or
response (``RESPONSE``) body and its payload; the layouts are in docs/formats.md
("Replication formats", "Wire frame"). The magic and version on every frame mean a node
never misreads a stray or future peer's bytes as a command; the CRC covers the header too,
so a flipped type or length is caught before anything acts on it.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum

from sediment.errors import WireError
from sediment.wal import record as rec

MAGIC = b"SDRP"
VERSION = 1
FRAME = struct.Struct("<4sBBHII")
FRAME_SIZE = FRAME.size
MAX_BODY = 64 << 20
REQUEST = struct.Struct("<Q16sIIqqq")
RESPONSE = struct.Struct("<QHHIqqqq")


class MsgType(IntEnum):
    OPEN = 1  # start (or join) session ``session_id``: fences every lower session
    APPEND = 2  # arg1: expected LSN of the first record; payload: record frames
    READ = 3  # arg1: first LSN, arg2: max bytes; payload of the response: record frames
    INFO = 4  # report max LSN and low-water marks
    SET_LWM = 5  # arg1: low-water mark; persisted with the session in the control file
    TRUNCATE = 6  # arg1: drop every record with LSN >= arg1, durably
    TRIM = 7  # arg1: records below arg1 are compacted elsewhere; drop whole segments below it
    RESET = 8  # arg1: drop every record and continue at LSN arg1 (a replica behind the others' trim)
    RESPONSE = 128


class Status(IntEnum):
    OK = 0
    FENCED = 1  # a higher session exists: the sender is superseded
    WRONG_CLUSTER = 2  # the cluster key does not match the node's control file
    LSN_MISMATCH = 3  # APPEND at an LSN that is not the next one (max LSN tells which is)
    BAD_REQUEST = 4  # malformed, unknown type, or no OPEN for this session yet
    FAILED = 5  # the node could not do it (I/O error); see the message
    TRIMMED = 6  # READ below the node's first kept LSN; the payload is that LSN (u64)


@dataclass(frozen=True, slots=True)
class Request:
    type: MsgType
    request_id: int
    cluster_key: uuid.UUID
    partition: int
    session_id: int
    arg1: int = 0
    arg2: int = 0
    payload: bytes = b""


@dataclass(frozen=True, slots=True)
class Response:
    request_id: int
    status: Status
    message: str = ""
    node_session: int = 0
    max_lsn: int = -1
    low_water_mark: int = -1
    local_low_water_mark: int = -1
    payload: bytes = b""

    @property
    def ok(self) -> bool:
        return self.status == Status.OK


def frame(msg_type: int, body: bytes | bytearray | memoryview) -> bytes:
    """One whole frame around ``body``."""
    if len(body) > MAX_BODY:
        raise WireError(f"message body of {len(body)} bytes exceeds the {MAX_BODY}-byte frame limit; "
                        "send fewer records per message")
    head = FRAME.pack(MAGIC, VERSION, msg_type, 0, len(body), 0)[:12]
    crc = rec.crc32c(body, rec.crc32c(head))
    return head + struct.pack("<I", crc) + bytes(body)


def parse_frame_header(head: bytes) -> tuple[int, int, int]:
    """(type, body length, crc) of a 16-byte frame header; WireError when it is not one."""
    magic, version, msg_type, _res, body_len, crc = FRAME.unpack(head)
    if magic != MAGIC:
        raise WireError(f"bad frame magic {magic!r} (expected {MAGIC!r}): the peer is not a sediment "
                        "storage node or coordinator")
    if version != VERSION:
        raise WireError(f"peer speaks wire version {version}, this build speaks {VERSION}; upgrade the older side")
    if body_len > MAX_BODY:
        raise WireError(f"frame claims a {body_len}-byte body, above the {MAX_BODY}-byte limit")
    return msg_type, body_len, crc


def check_body(head: bytes, body: bytes, crc: int) -> None:
    if rec.crc32c(body, rec.crc32c(head[:12])) != crc:
        raise WireError("frame fails its CRC32C: the connection corrupted it; reconnect")


def encode_request(req: Request) -> bytes:
    body = REQUEST.pack(req.request_id, req.cluster_key.bytes, req.partition, 0, req.session_id,
                        req.arg1, req.arg2) + req.payload
    return frame(req.type, body)


def encode_response(resp: Response) -> bytes:
    msg = resp.message.encode()
    body = RESPONSE.pack(resp.request_id, resp.status, 0, len(msg), resp.node_session, resp.max_lsn,
                         resp.low_water_mark, resp.local_low_water_mark) + msg + resp.payload
    return frame(MsgType.RESPONSE, body)


def decode(msg_type: int, body: bytes) -> Request | Response:
    """A checked frame's body as a Request or Response; WireError if malformed."""
    try:
        if msg_type == MsgType.RESPONSE:
            rid, status, _r, mlen, sess, max_lsn, lwm, llwm = RESPONSE.unpack_from(body, 0)
            off = RESPONSE.size
            if off + mlen > len(body):
                raise WireError(f"response message length {mlen} runs past its {len(body)}-byte body")
            return Response(rid, Status(status), body[off:off + mlen].decode(), sess, max_lsn, lwm, llwm,
                            body[off + mlen:])
        rid, key, part, _r, sess, a1, a2 = REQUEST.unpack_from(body, 0)
        return Request(MsgType(msg_type), rid, uuid.UUID(bytes=key), part, sess, a1, a2, body[REQUEST.size:])
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise WireError(f"malformed message of type {msg_type} ({len(body)} bytes): {exc}") from exc


def decode_message(data: bytes) -> Request | Response:
    """Decode one whole frame held in ``data`` (tests, docs)."""
    msg_type, body_len, crc = parse_frame_header(data[:FRAME_SIZE])
    body = data[FRAME_SIZE:FRAME_SIZE + body_len]
    if len(body) != body_len:
        raise WireError(f"frame is {len(data)} bytes, its header says {FRAME_SIZE + body_len}")
    check_body(data[:FRAME_SIZE], body, crc)
    return decode(msg_type, body)


def iter_records(payload: bytes) -> Iterator[rec.Record]:
    """The records in a payload, each checked (header CRC, body CRC); WireError on damage."""
    view = memoryview(payload)
    pos = 0
    while pos < len(payload):
        u, why = rec.check_frame(view, pos)
        if u is None:
            raise WireError(f"record frame at payload offset {pos} {why}")
        yield rec.record_of(u, view[pos + rec.HEADER_SIZE:pos + rec.HEADER_SIZE + u[4]])
        pos += rec.HEADER_SIZE + u[4]


class FrameReader:
    """Buffers a trio stream so messages are cut from large reads (one syscall, many frames)."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.buf = bytearray()

    async def _fill(self, n: int) -> bool:
        while len(self.buf) < n:
            chunk = await self.stream.receive_some(1 << 20)
            if not chunk:
                return False
            self.buf += chunk
        return True

    async def next(self) -> Request | Response | None:
        if not await self._fill(FRAME_SIZE):
            if self.buf:
                raise WireError(f"connection closed inside a frame header ({len(self.buf)} bytes)")
            return None
        head = bytes(self.buf[:FRAME_SIZE])
        msg_type, body_len, crc = parse_frame_header(head)
        if not await self._fill(FRAME_SIZE + body_len):
            raise WireError(f"connection closed inside a {body_len}-byte frame body")
        body = bytes(self.buf[FRAME_SIZE:FRAME_SIZE + body_len])
        del self.buf[:FRAME_SIZE + body_len]
        check_body(head, body, crc)
        return decode(msg_type, body)
