"""``sediment verify`` runs the recovery code the logs run, never a copy of it (issue 14):
the device ring through wal/device/recovery.inspect, whose slot size comes from the same
constant ``DeviceLog.open`` uses (the old verify hard-coded 4096-byte header slots), the
file log through wal/log_open and wal/log_reader."""

from __future__ import annotations

import ast
import inspect as pyinspect
import pathlib

import pytest

from sediment.engine.verify import VerifyReport, verify_device
from sediment.errors import SedimentError, WalShortened
from sediment.wal.device import recovery
from sediment.wal.device.format import DEFAULT_BLOCK_SIZE, RingHeader
from sediment.wal.device.log import DeviceLog
from sediment.wal.record import Record, RecordKind

VERIFY = pathlib.Path(__file__).resolve().parent.parent.parent / "engine" / "verify.py"


def _ring(path: pathlib.Path, bs: int, records: int = 6) -> None:
    log = DeviceLog.open(path, 64 * bs, create=True, block_size=bs)
    for i in range(records):
        log.append([Record(RecordKind.UPDATES, relation_id=1, t_lo=i, t_hi=i, count=1, body=bytes([i]) * 100)])
    log.finish_segment()
    log.close()


def _verdict(path: pathlib.Path) -> VerifyReport:
    report = VerifyReport()
    verify_device(str(path), report)
    return report


def _open_error(path: pathlib.Path) -> str | None:
    try:
        DeviceLog.open(path).close()
    except SedimentError as exc:
        return str(exc)
    return None


def test_inspect_uses_the_block_size_open_uses():
    """One default, from wal/device/format.py, so verify's verdict is the verdict of the open
    the engine runs."""
    default = pyinspect.signature(DeviceLog.open).parameters["block_size"].default
    assert default == DEFAULT_BLOCK_SIZE
    assert pyinspect.signature(recovery.inspect).parameters["block_size"].default == DEFAULT_BLOCK_SIZE


@pytest.mark.parametrize("bs", [4096, 8192])
def test_verify_agrees_with_open_on_rings_of_each_block_size(tmp_path, bs):
    path = tmp_path / "ring"
    _ring(path, bs)
    report, refused = _verdict(path), _open_error(path)
    assert report.ok == (refused is None)
    if refused is not None:
        assert report.problems == [refused]


def test_verify_and_open_agree_on_a_shortened_ring(tmp_path):
    bs = 4096
    path = tmp_path / "ring"
    _ring(path, bs)
    image = bytearray(path.read_bytes())
    hdr = max((RingHeader.unpack(image[i * bs:(i + 1) * bs]) for i in range(2)), key=lambda h: h.seq)
    assert hdr.durable_end > 4 * bs
    image[2 * bs + 2 * bs:2 * bs + 4 * bs] = bytes(2 * bs)  # acknowledged records zeroed
    path.write_bytes(bytes(image))
    with pytest.raises(WalShortened) as opened:
        DeviceLog.open(path)
    report = _verdict(path)
    assert not report.ok and report.problems == [str(opened.value)]
    assert report.wal_findings and report.wal_findings[0].lost


def test_verify_has_no_parser_of_its_own():
    """No struct layouts, CRCs, magics or slot sizes in verify.py: it only calls the logs' code."""
    tree = ast.parse(VERIFY.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported |= {f"{node.module}.{a.name}" for a in node.names}
    assert not any(m.split(".")[0] in {"struct", "crc32c", "zlib", "mmap"} for m in imported), imported
    assert "sediment.wal.device.recovery.inspect" in imported
    assert "sediment.wal.log_open.decide_open" in imported
    assert "sediment.wal.log_reader" in {m.rsplit(".", 1)[0] for m in imported} | imported
    numbers = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, int)}
    assert not numbers & {64, 76, 128, 4096, 8192}, numbers
    text = VERIFY.read_text()
    assert "SDMTRING" not in text and "SDSG" not in text
