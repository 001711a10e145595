"""Issue 12 campaign finding: a power cut while the log was being created left the control
file but no durable manifest; open (rightly) finished the interrupted creation while
``verify`` reported "log manifest ... is missing". Both now call one rule
(wal/log_open.decide_open). Checked exhaustively: every combination of a lost control file,
manifest and segments, on a freshly created and on a written log, opened as a first open
(``create``) and as a later one -- verify exits clean exactly when open succeeds with every
acknowledged record."""

from __future__ import annotations

import itertools
import os
import shutil

import pytest

from sediment.engine.verify import VerifyReport, verify_wal
from sediment.errors import SedimentError
from sediment.wal import manifest as mf
from sediment.wal.control import CONTROL_NAME, ControlFile
from sediment.wal.file_log import FileLog
from sediment.wal.record import Record, RecordKind

PARTS = ("control", "manifest", "segments")


def _written(root: str, n: int) -> dict[int, bytes]:
    log = FileLog.open(root, create=True, segment_bytes=8192)
    acked = {}
    for t in range(n):
        body = b"%06d" % t * 100
        acked[log.append([Record(RecordKind.UPDATES, relation_id=3, t_lo=t, t_hi=t, count=1, body=body)])] = body
    log.close()
    return acked


def _remove(root: str, part: str) -> None:
    if part == "control":
        os.unlink(os.path.join(root, CONTROL_NAME))
    elif part == "manifest":
        os.unlink(os.path.join(root, mf.manifest_name(0)))
    else:
        pdir = os.path.join(root, "0")
        for name in os.listdir(pdir):
            os.unlink(os.path.join(pdir, name))


@pytest.fixture(scope="module")
def templates(tmp_path_factory) -> dict[str, tuple[str, dict[int, bytes]]]:
    base = tmp_path_factory.mktemp("templates")
    out = {}
    for name, n in (("fresh", 0), ("written", 40)):
        root = str(base / name)
        out[name] = (root, _written(root, n))
    return out


@pytest.mark.parametrize("create", [True, False])
@pytest.mark.parametrize("name", ["fresh", "written"])
def test_verify_and_open_share_one_rule(templates, tmp_path, name, create):
    source, acked = templates[name]
    for k in range(len(PARTS) + 1):
        for lost in itertools.combinations(PARTS, k):
            root = str(tmp_path / f"{name}-{create}-{'-'.join(lost) or 'whole'}")
            shutil.copytree(source, root)
            for part in lost:
                _remove(root, part)
            report = VerifyReport()
            verify_wal(root, report, expected=not create)
            try:
                log = FileLog.open(root, create=create, segment_bytes=8192)
            except SedimentError as exc:
                assert not report.ok, (lost, create, str(exc))
                continue
            try:
                got = {r.lsn: bytes(r.body) for r in log.scan() if r.kind == RecordKind.UPDATES}
            finally:
                log.close()
            # Nothing of the log left on a first open: an empty directory, nothing to tell (the
            # engine's metadata is what records that a log existed: MetadataMissing there).
            want = {} if create and len(lost) == len(PARTS) else acked
            assert got == want, (lost, create, "open lost acknowledged records")
            assert report.ok, (lost, create, report.problems)


def test_power_cut_during_creation_is_an_interrupted_creation_in_both(tmp_path):
    """The campaign's state: the control file became durable, the manifest did not."""
    root = str(tmp_path / "wal")
    os.makedirs(root)
    ControlFile.create(root, None)
    report = VerifyReport()
    verify_wal(root, report, expected=False)
    assert report.ok and any("interrupted" in n for n in report.notes), report.problems
    FileLog.open(root, create=True).close()
    # A later open (the metadata records the log) finds the manifest it must have.
    os.unlink(os.path.join(root, mf.manifest_name(0)))
    report = VerifyReport()
    verify_wal(root, report, expected=True)
    assert not report.ok and any("manifest" in p for p in report.problems)
    with pytest.raises(SedimentError, match="manifest"):
        FileLog.open(root, create=False)
