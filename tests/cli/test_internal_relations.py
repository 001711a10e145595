"""Internal relations (names starting with an underscore, such as the Spark sink's progress
relation ``_spark_sink.<id>``) stay out of the listings meant for users: ``relations()`` and
``stats()`` in process and over the network, and the CLI's ``relation list`` and ``stats``.
They stay reachable: ``include_internal=True`` and ``--all`` list them, and every call that
names one works as for any relation (issue 24, finding 9)."""

from __future__ import annotations

import json

import pyarrow as pa

import sediment
from sediment.cli import main

SCHEMA = pa.schema([("id", pa.int64())])
PROGRESS = "_spark_sink.0123abcd"


def test_relations_and_stats_hide_internal_relations_unless_asked(open_engine):
    engine = open_engine()  # embedded, and through a Flight server and client
    for name in ("orders", PROGRESS, "events"):
        engine.add_relation(name, SCHEMA)
    assert engine.relations() == ["events", "orders"]
    assert engine.relations(include_internal=True) == [PROGRESS, "events", "orders"]
    assert sorted(engine.stats()["relations"]) == ["events", "orders"]
    assert sorted(engine.stats(include_internal=True)["relations"]) == [PROGRESS, "events", "orders"]
    engine.seal(PROGRESS, 3)  # hidden from listings only: reachable by name
    assert engine.sealed(PROGRESS) == 3 and engine.schema(PROGRESS) == SCHEMA


def test_cli_relation_list_and_stats_show_internal_relations_only_with_all(tmp_path, capsys):
    d = tmp_path / "data"
    with sediment.open(d, segment_bytes=1 << 20) as engine:
        engine.add_relation("orders", SCHEMA)
        engine.add_relation(PROGRESS, SCHEMA)

    def names(*argv: str) -> list[str]:
        assert main(["--data-dir", str(d), *argv]) == 0
        out = capsys.readouterr().out
        if "--json" in argv:
            return sorted(json.loads(out)["relations"])
        return [line.split("\t")[0] for line in out.splitlines()]

    assert names("relation", "list") == ["orders"]
    assert names("relation", "list", "--all") == [PROGRESS, "orders"]
    assert names("stats", "--json") == ["orders"]
    assert names("stats", "--json", "--all") == [PROGRESS, "orders"]
