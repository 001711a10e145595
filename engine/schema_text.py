"""Relation schemas as text: the one grammar that ``--schema`` reads and that ``sediment
relation list`` prints, so a printed schema can be fed back to ``relation add``.

    SPEC  := FIELD ("," FIELD)*          FIELD := NAME ":" TYPE
    NAME  := printable text without , : " [ ] ( ) or surrounding blanks, or a JSON string
    TYPE  := WORD | WORD "[" ARGS "]" | WORD "(" ARGS ")"   (case-insensitive, blanks allowed)

:func:`format_type` writes each type in one canonical spelling (``int64``,
``decimal128(10,2)``, ``timestamp[us,tz=UTC]``, ``time32[ms]``, ``duration[ns]``,
``fixed_size_binary[16]``); the parser also takes aliases (``int``/``integer`` are int32
and ``bigint``/``long`` int64, as in Spark and SQL; ``decimal(p,s)``, ``timestamp`` for
microseconds) and pyarrow's own ``str(type)``.
"""

from __future__ import annotations

import json
import re

import pyarrow as pa

from sediment.engine.schema import check_schema, known_zone
from sediment.errors import SchemaMismatch

_SIMPLE: dict[str, pa.DataType] = {  # canonical name first for each type: format_type prints it
    "int8": pa.int8(), "tinyint": pa.int8(), "byte": pa.int8(),
    "int16": pa.int16(), "smallint": pa.int16(), "short": pa.int16(),
    "int32": pa.int32(), "int": pa.int32(), "integer": pa.int32(),
    "int64": pa.int64(), "bigint": pa.int64(), "long": pa.int64(),
    "uint8": pa.uint8(), "uint16": pa.uint16(), "uint32": pa.uint32(), "uint64": pa.uint64(),
    "float32": pa.float32(), "float": pa.float32(), "real": pa.float32(),
    "float64": pa.float64(), "double": pa.float64(),
    "bool": pa.bool_(), "boolean": pa.bool_(),
    "string": pa.string(), "utf8": pa.string(), "large_string": pa.large_string(), "large_utf8": pa.large_string(),
    "binary": pa.binary(), "large_binary": pa.large_binary(),
    "date32": pa.date32(), "date": pa.date32(), "date64": pa.date64(),
    "timestamp": pa.timestamp("us"),
}
_CANONICAL: dict[pa.DataType, str] = {}
for _name, _type in _SIMPLE.items():
    _CANONICAL.setdefault(_type, _name)
_DEFAULT_ARG = {"date32": "day", "date64": "ms"}  # pyarrow prints date32[day], date64[ms]
_UNITS = {"timestamp": ("s", "ms", "us", "ns"), "duration": ("s", "ms", "us", "ns"), "time32": ("s", "ms"),
          "time64": ("us", "ns"), "time": ("s", "ms", "us", "ns")}
_DECIMALS = {"decimal32": 9, "decimal64": 18, "decimal128": 38, "decimal256": 76}
_BARE_NAME = re.compile(r"[^,:\"\s\[\]()](?:[^,:\"\[\]()]*[^,:\"\s\[\]()])?")
_TYPE = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:([\[(])(.*)([\])]))?\s*", re.DOTALL)
KNOWN = ("int8..int64 (int = int32, bigint/long = int64), uint8..uint64, float32/float, float64/double, bool, "
         "string, large_string, binary, large_binary, fixed_size_binary[N], date32/date, date64, "
         "time32[s|ms], time64[us|ns], timestamp[UNIT] or timestamp[UNIT,tz=ZONE], duration[UNIT], "
         "decimal(P,S) / decimal32(P,S) / decimal64(P,S) / decimal128(P,S) / decimal256(P,S)")


def format_name(name: str) -> str:
    """A column name as the grammar spells it: bare when it can be, else a JSON string."""
    return name if name.isprintable() and _BARE_NAME.fullmatch(name) else json.dumps(name)


def format_type(t: pa.DataType) -> str:
    """The canonical spelling of a column type (parsed back by :func:`parse_type`)."""
    if t in _CANONICAL and not pa.types.is_timestamp(t):
        return _CANONICAL[t]
    if pa.types.is_timestamp(t):
        return f"timestamp[{t.unit},tz={t.tz}]" if t.tz else f"timestamp[{t.unit}]"
    if pa.types.is_time32(t) or pa.types.is_time64(t) or pa.types.is_duration(t):
        return f"{'duration' if pa.types.is_duration(t) else 'time32' if pa.types.is_time32(t) else 'time64'}" \
               f"[{t.unit}]"
    if pa.types.is_decimal(t):
        return f"decimal{t.bit_width}({t.precision},{t.scale})"
    if pa.types.is_fixed_size_binary(t):
        return f"fixed_size_binary[{t.byte_width}]"
    raise SchemaMismatch(f"type {t} has no --schema spelling: relations cannot have it; {_known_hint()}")


def format_schema(schema: pa.Schema) -> str:
    """``id:int64,name:string``: what ``relation list`` prints and ``--schema`` reads."""
    return ",".join(f"{format_name(f.name)}:{format_type(f.type)}" for f in schema)


def _known_hint() -> str:
    return f"known types: {KNOWN}"


def _int_arg(text: str, what: str, spelled: str) -> int:
    if not (text.isascii() and text.isdigit()):  # str.isdigit takes '²', which int() refuses
        raise SchemaMismatch(f"type {spelled!r}: {what} must be a whole number, not {text!r}; e.g. decimal(10,2)")
    return int(text)


def _unit_type(word: str, args: list[str], spelled: str) -> pa.DataType:
    units = _UNITS[word]
    unit = args[0].lower() if args else ""
    if unit not in units or len(args) > (2 if word == "timestamp" else 1):
        raise SchemaMismatch(f"type {spelled!r}: write {word}[UNIT] with UNIT one of {', '.join(units)}"
                             + (" (and optionally ,tz=ZONE)" if word == "timestamp" else ""))
    if word == "duration":
        return pa.duration(unit)
    if word in ("time", "time32", "time64"):
        return pa.time32(unit) if unit in ("s", "ms") else pa.time64(unit)
    tz = args[1] if len(args) == 2 else None
    if tz is not None:
        tz = tz[3:].strip() if tz.lower().startswith("tz=") else tz
        _check_zone(tz, spelled)
    return pa.timestamp(unit, tz=tz)


def _check_zone(tz: str, spelled: str) -> None:
    if not known_zone(tz):
        raise SchemaMismatch(f"type {spelled!r}: unknown time zone {tz!r}; use an IANA name such as UTC or "
                             "Europe/Paris, or an offset such as +05:30") from None


def _decimal_type(word: str, args: list[str], spelled: str) -> pa.DataType:
    if not 1 <= len(args) <= 2:
        raise SchemaMismatch(f"type {spelled!r}: write {word}(PRECISION,SCALE), e.g. decimal(10,2)")
    precision = _int_arg(args[0], "the precision", spelled)
    scale = _int_arg(args[1], "the scale", spelled) if len(args) == 2 else 0
    if word == "decimal":
        word = "decimal128" if precision <= _DECIMALS["decimal128"] else "decimal256"
    if not 1 <= precision <= _DECIMALS[word] or scale > precision:
        raise SchemaMismatch(f"type {spelled!r}: {word} takes a precision in 1..{_DECIMALS[word]} and a scale "
                             "no larger than the precision")
    return getattr(pa, word)(precision, scale)


def parse_type(text: str) -> pa.DataType:
    """One column type in any spelling the grammar knows (see the module doc)."""
    m = _TYPE.fullmatch(text)
    if not m or (m.group(2) is not None and "[(".index(m.group(2)) != "])".index(m.group(4))):
        raise SchemaMismatch(f"unknown type {text.strip()!r}; {_known_hint()}")
    word, spelled = m.group(1).lower(), text.strip()
    args = [a.strip() for a in m.group(3).split(",")] if m.group(2) is not None else []
    if m.group(2) is not None and not all(args):
        raise SchemaMismatch(f"type {spelled!r} has an empty argument; {_known_hint()}")
    if word in _SIMPLE and (not args or args == [_DEFAULT_ARG.get(word)]):
        return _SIMPLE[word]
    if word in _UNITS:
        return _unit_type(word, args, spelled)
    if word in _DECIMALS or word == "decimal":
        return _decimal_type(word, args, spelled)
    if word in ("fixed_size_binary", "binary") and len(args) == 1:
        width = _int_arg(args[0], "the width", spelled)
        if 1 <= width < 1 << 31:
            return pa.binary(width)
    raise SchemaMismatch(f"unknown type {spelled!r}; {_known_hint()}")


def _fields(spec: str) -> list[str]:
    """``spec`` cut at the commas outside brackets and quoted names."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(spec):
        c = spec[i]
        if c == '"':
            try:
                _name, i = json.JSONDecoder().raw_decode(spec, i)
            except json.JSONDecodeError:
                raise SchemaMismatch(f"unterminated quoted name at character {i + 1} of {spec!r}: write "
                                     '"NAME":TYPE with the quotes closed') from None
            continue
        depth += (c in "[(") - (c in "])")
        if c == "," and depth == 0:
            parts.append(spec[start:i])
            start = i + 1
        i += 1
    parts.append(spec[start:])
    return parts


def _field(part: str, where: str) -> pa.Field:
    text = part.strip()
    if text.startswith('"'):
        name, end = json.JSONDecoder().raw_decode(text)
        rest = text[end:].lstrip()
        colon, type_text = rest[:1], rest[1:]
    else:
        name, colon, type_text = text.partition(":")
        name = name.strip()
    if colon != ":" or not name or not type_text.strip():
        raise SchemaMismatch(f"bad column spec {text!r} ({where}): write NAME:TYPE, e.g. id:int64")
    try:
        return pa.field(name, parse_type(type_text))
    except SchemaMismatch as exc:
        raise SchemaMismatch(f"column {name!r} ({where}): {exc}") from None
    except UnicodeError as exc:  # a name Arrow cannot store as UTF-8 (a lone surrogate)
        raise SchemaMismatch(f"column {name!r} ({where}): the name is not valid Unicode text ({exc.reason})") from None


def parse_schema_spec(spec: str) -> pa.Schema:
    """``'id:int64,price:decimal(10,2)'`` to a relation schema (the CLI's ``--schema``).
    Strict: every comma-separated field must be ``NAME:TYPE`` with both parts present, so a
    stray comma or colon is refused rather than silently skipped."""
    if not isinstance(spec, str) or not spec.strip():
        raise SchemaMismatch("empty schema: give at least one NAME:TYPE, e.g. id:int64,name:string")
    fields = []
    for i, part in enumerate(_fields(spec)):
        where = f"field {i + 1} of {spec!r}"
        if not part.strip():
            raise SchemaMismatch(f"{where} is empty (a stray comma?): write NAME:TYPE,NAME:TYPE")
        fields.append(_field(part, where))
    return check_schema(pa.schema(fields))
