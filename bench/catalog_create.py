"""What a local engine's add_relation writes: since the epoch confirmation (engine/catalog.py)
is made only by shared deployments, a local one writes the relation counter and the entry,
two journal writes (each an fdatasync), instead of three.

Rounds interleaved: ``confirmed`` is a local engine made to confirm as a shared one does (what
every engine did before), ``local`` is it as opened. Per add_relation: fdatasync calls
(counted) and CPU of this process (``resource.getrusage``), median (min-max), with the load.

    .venv/bin/python bench/catalog_create.py --relations 200 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile

import pyarrow as pa

import sediment

SCHEMA = pa.schema([("id", pa.int64())])


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def one_round(relations: int, confirmed: bool) -> tuple[float, float]:
    """fdatasync calls and CPU microseconds per add_relation."""
    plain, syncs = os.fdatasync, [0]

    def counting(fd: int) -> None:
        syncs[0] += 1
        plain(fd)

    with tempfile.TemporaryDirectory() as d, sediment.open(os.path.join(d, "e"), compact_interval=None) as eng:
        eng.catalog.shared = confirmed
        os.fdatasync = counting
        try:
            start = cpu()
            for i in range(relations):
                eng.add_relation(f"r{i}", SCHEMA)
            used = cpu() - start
        finally:
            os.fdatasync = plain
    return syncs[0] / relations, used / relations * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--relations", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    got: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for _ in range(args.rounds):
        for confirmed in (True, False):
            got[confirmed].append(one_round(args.relations, confirmed))
    print(f"load average {os.getloadavg()}")

    def fmt(values: list[float], unit: str) -> str:
        return f"{statistics.median(values):.2f}{unit} ({min(values):.2f}-{max(values):.2f})"

    for what, i, unit in (("fdatasync per add_relation", 0, ""), ("CPU per add_relation", 1, " us")):
        print(f"{what}: confirmed {fmt([r[i] for r in got[True]], unit)} | "
              f"local {fmt([r[i] for r in got[False]], unit)}")


if __name__ == "__main__":
    main()
