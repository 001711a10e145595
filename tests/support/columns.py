"""Every column type the engine stores, each with three distinct values in ascending order: the
engine's column tests and the CLI's rendering tests walk the same table."""

from __future__ import annotations

import datetime
import decimal

import pyarrow as pa

D = decimal.Decimal
UTC = datetime.UTC
WORKS = {  # type -> three distinct values, in ascending order
    "int8": (pa.int8(), [-128, 0, 127]),
    "int16": (pa.int16(), [-5, 0, 5]),
    "int32": (pa.int32(), [-5, 0, 2**31 - 1]),
    "int64": (pa.int64(), [-(2**63), 0, 2**63 - 1]),
    "uint8": (pa.uint8(), [0, 1, 255]),
    "uint16": (pa.uint16(), [0, 1, 65535]),
    "uint32": (pa.uint32(), [0, 1, 2**32 - 1]),
    "uint64": (pa.uint64(), [0, 1, 2**64 - 1]),
    "float32": (pa.float32(), [-1.5, 0.0, 2.25]),
    "float64": (pa.float64(), [-1.5, 0.0, 1e300]),
    "decimal32": (pa.decimal32(5, 2), [D("-3.10"), D("0.00"), D("1.25")]),
    "decimal64": (pa.decimal64(12, 2), [D("-3.10"), D("0.00"), D("1.25")]),
    "decimal128": (pa.decimal128(10, 2), [D("-3.10"), D("0.00"), D("1.25")]),
    "decimal256": (pa.decimal256(50, 3), [D("-1.000"), D("0.001"), D("12345678901234567890123456789.123")]),
    "bool": (pa.bool_(), [False, True, None]),
    "string": (pa.string(), ["", "a", "é"]),
    "large_string": (pa.large_string(), ["", "a", "b"]),
    "binary": (pa.binary(), [b"", b"\x00", b"\xff"]),
    "large_binary": (pa.large_binary(), [b"", b"a", b"b"]),
    "fixed_size_binary": (pa.binary(2), [b"\x00\x00", b"ab", b"\xff\xff"]),
    "date32": (pa.date32(), [datetime.date(1970, 1, 1), datetime.date(2020, 2, 29), datetime.date(9999, 12, 31)]),
    "date64": (pa.date64(), [datetime.date(1969, 12, 31), datetime.date(2020, 2, 29), datetime.date(2100, 1, 1)]),
    "time32[s]": (pa.time32("s"), [datetime.time(0, 0, 0), datetime.time(1, 2, 3), datetime.time(23, 59, 59)]),
    "time32[ms]": (pa.time32("ms"), [datetime.time(0), datetime.time(1, 2, 3, 4000), datetime.time(23)]),
    "time64[us]": (pa.time64("us"), [datetime.time(0), datetime.time(1, 2, 3, 4), datetime.time(23)]),
    "time64[ns]": (pa.time64("ns"), [datetime.time(0), datetime.time(1, 2, 3, 4), datetime.time(23)]),
    "timestamp[s]": (pa.timestamp("s"), [datetime.datetime(1960, 1, 1), datetime.datetime(2020, 1, 1),
                                         datetime.datetime(2200, 1, 1)]),
    "timestamp[ms]": (pa.timestamp("ms"), [datetime.datetime(2020, 1, 1), datetime.datetime(2020, 1, 1, 0, 0, 1),
                                           datetime.datetime(2021, 1, 1)]),
    "timestamp[us, tz]": (pa.timestamp("us", tz="Europe/Paris"),
                          [datetime.datetime(2020, 1, 1, tzinfo=UTC), datetime.datetime(2020, 6, 1, tzinfo=UTC),
                           datetime.datetime(2021, 1, 1, tzinfo=UTC)]),
    "timestamp[ns, tz]": (pa.timestamp("ns", tz="UTC"), [datetime.datetime(2020, 1, 1, tzinfo=UTC),
                                                          datetime.datetime(2020, 1, 2, tzinfo=UTC),
                                                          datetime.datetime(2020, 1, 3, tzinfo=UTC)]),
    "duration[s]": (pa.duration("s"), [datetime.timedelta(seconds=-1), datetime.timedelta(0),
                                       datetime.timedelta(days=3)]),
    "duration[ns]": (pa.duration("ns"), [datetime.timedelta(0), datetime.timedelta(microseconds=1),
                                         datetime.timedelta(seconds=9)]),
}
