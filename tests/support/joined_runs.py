"""What the file log's joined-record tests share: the update schema they append in, the
ids a body holds, and a durable-callback recorder."""
from __future__ import annotations

import pyarrow as pa

from sediment.arrow_codec import decode_updates
from sediment.wal.record import Record

UPDATES = pa.schema([("id", pa.int64()), ("time", pa.int64()), ("diff", pa.int64())])


def ids_of(body: bytes) -> list[int]:
    """The ``id`` column of an UPDATES body in this schema, in row order."""
    return decode_updates(body, UPDATES).column(0).to_pylist()


class Calls:
    """An ``on_durable`` callback that keeps each call's records, in call order."""

    def __init__(self) -> None:
        self.got: list[list[Record]] = []

    def __call__(self, records) -> None:
        self.got.append(list(records))
