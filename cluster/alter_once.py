"""Alters that a retry does not apply twice: an alter names the schema version it starts from.

An alter is not written to the log but to the relation's catalog entry (one compare-and-set),
whose schema history keeps every version. A cluster client reads the relation's schema
version ``base``, then sends the alter with it. The owner applies it only while the relation
is at ``base``, so an alter lands, if at all, as version ``base + 1``. A retry after an
unknown outcome (here, or at a later owner, which reads the same catalog) finds the relation
past ``base``: if version ``base + 1`` is what this change makes of version ``base``, the
first attempt landed and the retry answers ``base + 1``; otherwise another alter took that
version, this one can never land, and the owner answers SchemaVersionMoved (nothing changed),
on which the client reads the version again and sends the alter from it.

Two clients sending the same change from the same version are not told apart: the second
is answered with the first's version, since the schema it asked for is the one in place.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from sediment.engine.schema_history import SchemaHistory
from sediment.engine.schema_rules import evolve
from sediment.errors import InvalidArgument, SchemaMismatch, SchemaVersionMoved
from sediment.trace.evolve import field_id


def at_version(history: SchemaHistory, version: int) -> SchemaHistory:
    """``history`` as it was when ``version`` was current. Field ids only grow and every id
    appears in the version that added it, so the next id then was one past the greatest seen."""
    versions = tuple(v for v in history.versions if v[0] <= version)
    next_id = 1 + max(field_id(f) for _v, cols in versions for f in cols)
    return SchemaHistory(versions, next_id, {i: d for i, d in history.defaults.items() if i < next_id})


def _same(a: SchemaHistory, cols: pa.Schema, b: SchemaHistory) -> bool:
    """Whether ``a``'s new version is ``cols`` (with ``b``'s defaults for its added columns)."""
    if not a.current.equals(cols, check_metadata=True):
        return False
    added = {field_id(f) for f in cols} - {i for _v, old in a.versions[:-1] for i in map(field_id, old)}
    return all(a.defaults.get(i) == b.defaults.get(i) for i in added)


def check_base(name: str, history: SchemaHistory, base: int, changes: dict[str, Any]) -> int | None:
    """None: the relation is at ``base``, apply the alter. ``base + 1``: the alter already
    landed as that version. SchemaVersionMoved: another alter took version ``base + 1``."""
    if history.version == base:
        return None
    if base < history.version:
        try:
            made = evolve(name, at_version(history, base), **changes)
        except (SchemaMismatch, InvalidArgument):  # refused at base: it never landed there
            made = None
        if made is not None and _same(made, dict(history.versions)[base + 1], history):
            return base + 1
    raise SchemaVersionMoved(f"relation {name!r} is at schema version {history.version}, not {base}: another alter "
                             "came first; nothing was changed: read schema_version and send the alter from it")
