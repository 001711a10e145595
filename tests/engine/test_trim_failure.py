"""A log trim that fails (the disk refuses the manifest write) is retried, and never turns a
read or a compaction pass that had nothing to do with it into an error."""

from __future__ import annotations

import os

import pyarrow as pa

import sediment
from sediment.wal import manifest as mf


def _manifest_temporary(eng) -> str:
    """Where the log writes its manifest's next version before the rename (sediment/_fs.py)."""
    log_ = eng.wal
    return os.path.join(log_.root, mf.manifest_name(log_._manifest.partition)) + f".{os.getpid()}.tmp"


def test_a_failed_trim_does_not_fail_the_read_that_triggered_it_and_is_retried(tmp_path):
    with sediment.open(tmp_path / "d", compact_interval=None, segment_bytes=1 << 12) as eng:
        eng.add_relation("r", pa.schema([("id", pa.int64())]))
        for t in range(1, 6):
            eng.append("r", pa.table({"id": list(range(t * 10, t * 10 + 10)), "time": [t] * 10, "diff": [1] * 10}))
        eng.seal("r", 5)
        replay = eng.replay("r")  # pinned: the pass's trim waits for it
        eng.compact()
        start = eng.wal.start_lsn
        assert eng.collector.trim_to is not None and eng.collector.trim_to > start
        blocker = _manifest_temporary(eng)
        os.mkdir(blocker)  # the manifest's temporary cannot be opened: every trim fails with EISDIR
        try:
            rows = sorted(i for b in replay for i in b.column("id").to_pylist())  # ends, unpins, trims
            assert rows == sorted(range(10, 60))
            assert eng.wal.start_lsn == start  # nothing trimmed, and nothing lost
            assert sorted(eng.snapshot("r", 5).column("id").to_pylist()) == sorted(range(10, 60))
        finally:
            os.rmdir(blocker)
        eng.snapshot("r", 5)  # the next collection trims what the failed one left
        assert eng.wal.start_lsn > start
    with sediment.open(tmp_path / "d", compact_interval=None) as eng:
        assert sorted(eng.snapshot("r", 5).column("id").to_pylist()) == sorted(range(10, 60))
