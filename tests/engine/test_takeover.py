"""The replicated data-directory marker (engine/data_dir.py) and the shared-blob rule (engine/takeover.py)."""

from __future__ import annotations

import pytest

import sediment
from sediment.engine.data_dir import decode_marker, encode_marker, read_marker, write_marker
from sediment.engine.takeover import require_shared_blob
from sediment.errors import StorageRecordMismatch


def test_every_damaged_marker_is_refused_with_a_typed_error():
    good = encode_marker("zk://127.0.0.1:2181/x")
    assert decode_marker(good) == "zk://127.0.0.1:2181/x"
    for i in range(len(good)):
        for bit in range(8):
            bad = bytearray(good)
            bad[i] ^= 1 << bit
            with pytest.raises(StorageRecordMismatch):
                decode_marker(bytes(bad))
    for n in range(len(good)):
        with pytest.raises(StorageRecordMismatch):
            decode_marker(good[:n])


def test_a_version_1_marker_with_a_zlib_crc_is_still_read_and_a_new_one_is_version_2_crc32c():
    import struct
    import zlib

    import crc32c

    spec = b"zk://127.0.0.1:2181/sediment"
    body = b"SDREPLIC" + struct.pack("<HH", 1, len(spec)) + spec
    assert decode_marker(body + struct.pack("<I", zlib.crc32(body))) == spec.decode()
    with pytest.raises(StorageRecordMismatch, match="checksum"):
        decode_marker(body + struct.pack("<I", crc32c.crc32c(body)))
    new = encode_marker(spec.decode())
    assert struct.unpack_from("<H", new, 8) == (2,)
    assert struct.unpack_from("<I", new, len(new) - 4) == (crc32c.crc32c(new[:-4]),)


def test_marker_round_trip_and_a_marker_naming_a_python_object_refuses_to_open_without_metadata(tmp_path):
    """A marker names its metadata store so that later opens find it; a store that was a
    Python object (written as ``<ClassName>``) cannot be found from its name: refused."""
    assert read_marker(str(tmp_path)) is None
    write_marker(str(tmp_path), "zk://h:1/root")
    assert read_marker(str(tmp_path)) == "zk://h:1/root"
    write_marker(str(tmp_path), "<MemoryMetadataStore>")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(StorageRecordMismatch, match="<MemoryMetadataStore>"):
        sediment.open(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("blob", [None, "memory://", "/some/path"])
def test_replicated_mode_refuses_blob_stores_other_coordinators_cannot_reach(blob):
    with pytest.raises(StorageRecordMismatch, match="every coordinator"):
        require_shared_blob(blob, "/data")
    require_shared_blob("s3://bucket/prefix", "/data")
    require_shared_blob("file:///shared/mount", "/data")


def test_tail_cache_keeps_lsn_order_evicts_oldest_and_forgets_trimmed():
    from sediment.wal.record import Record, RecordKind
    from sediment.wal.replication.tail_cache import TailCache

    def r(lsn: int, n: int = 10) -> Record:
        return Record(RecordKind.UPDATES, body=bytes(n), lsn=lsn)

    size = r(0).frame_size
    cache = TailCache(max_bytes=3 * size)
    cache.add([r(0), r(1)])
    cache.add([r(2), r(3)])
    assert [cache.get(i) is not None for i in range(4)] == [False, True, True, True], "oldest evicted"
    assert cache.bytes == 3 * size
    cache.add([r(1)])
    assert len(cache) == 3
    cache.trim(3)
    assert cache.get(2) is None and cache.get(3).lsn == 3 and cache.bytes == size
    cache.trim(10)
    assert len(cache) == 0 and cache.bytes == 0


def test_cli_errors_name_flags_not_the_python_options():
    from sediment.cli.common import CLI_OPTIONS, cli_option_names

    assert cli_option_names("pass blob='s3://bucket/prefix' (with s3_endpoint= if not AWS)") == \
        "pass --blob s3://bucket/prefix (with --s3-endpoint if not AWS)"
    assert cli_option_names("replicas=[...] needs metadata='zk://h:1/r'") == \
        "--replicas HOST:PORT,... needs --metadata zk://h:1/r"
    assert cli_option_names("take_over_blob_prefix=True; cluster_key=\"k\"") == "--take-over-blob-prefix; --cluster-key k"
    assert cli_option_names("my_blob='x' and --blob y") == "my_blob='x' and --blob y"  # only whole option names
    from sediment.cli.parser import build_parser

    flags = {o for a in build_parser()._actions for o in a.option_strings}
    assert set(CLI_OPTIONS.values()) <= flags, "every translated option is a real flag"


def test_cli_says_replicas_need_metadata_in_flags(tmp_path, capsys):
    from sediment.cli import main

    code = main(["--data-dir", str(tmp_path / "d"), "--replicas", "127.0.0.1:1", "--cluster-key",
                 "5e5e5e5e-0000-4000-8000-000000000001", "relation", "add", "r", "--schema", "k:int64"])
    err = capsys.readouterr().err
    assert code != 0 and "--replicas HOST:PORT,... needs" in err and "--metadata zk://" in err, err
    assert "=" not in err.split("needs", 1)[1], err
    assert not (tmp_path / "d").exists()


@pytest.mark.zookeeper
def test_cli_says_which_blob_flag_a_replicated_engine_needs(tmp_path, capsys, zookeeper, zk_root):
    from sediment.cli import main

    code = main(["--data-dir", str(tmp_path / "d"), "--metadata", f"zk://{zookeeper.hosts}{zk_root}",
                 "--replicas", "127.0.0.1:1", "--cluster-key", "5e5e5e5e-0000-4000-8000-000000000001",
                 "relation", "add", "r", "--schema", "k:int64"])
    err = capsys.readouterr().err
    assert code != 0 and "--blob s3://bucket/prefix" in err and "--s3-endpoint" in err, err
    assert "blob='" not in err
