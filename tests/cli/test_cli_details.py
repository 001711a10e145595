"""The command line's details (issue 24, finding 10), each through real ``sediment`` processes
where the behaviour is the CLI's: the schema grammar printed and read back, ``tail --count``
and its hint, Ctrl-C, progress only on a terminal, ``--connect HOST:PORT``, TLS files
checked before serving, and no directory left behind by a failed first open or serve."""

from __future__ import annotations

import fcntl
import os
import pty
import queue
import select
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.columns import WORKS
from support.terminal import sigint_as_at_a_terminal

import sediment
from sediment.cli import main as cli_main
from sediment.cli import serve as cli_serve
from sediment.engine.schema_text import format_schema, format_type, parse_schema_spec, parse_type
from sediment.errors import InvalidArgument, SchemaMismatch
from sediment.server import SedimentFlightServer

RUN_TIMEOUT = 60  # seconds: a command that hangs fails the test instead of stalling it
ENV = {k: v for k, v in os.environ.items() if k not in ("SEDIMENT_DEBUG", "SEDIMENT_PROGRESS", "SEDIMENT_TOKEN")}


def sediment_cmd(*argv: str, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sediment", *argv], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT, env=kw.pop("env", ENV), **kw)


def popen(*argv: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "sediment", *argv], text=True, env=env or ENV, **kw)


def lines_of(stream) -> queue.Queue:
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in stream], daemon=True).start()
    return lines


def seeded(tmp_path, rows: int = 5) -> str:
    """A data directory with relation ``orders`` (id:int64): ``rows`` rows at time 1, sealed through 1."""
    d = str(tmp_path / "data")
    src = tmp_path / "seed.csv"
    src.write_text("id,time,diff\n" + "".join(f"{i},1,1\n" for i in range(rows)))
    for argv in (["relation", "add", "orders", "--schema", "id:int64"], ["append", "orders", str(src)],
                 ["seal", "orders", "1"]):
        assert cli_main(["--data-dir", d, "--no-progress", *argv]) == 0
    return d


# --- the schema grammar -----------------------------------------------------------------------

UNITS = st.sampled_from(["s", "ms", "us", "ns"])
ZONES = st.sampled_from(["UTC", "Europe/Paris", "America/New_York", "+05:30", "-08:00", "Asia/Kolkata"])
TYPES = st.one_of(
    st.sampled_from([t for t, _values in WORKS.values()]),
    st.builds(pa.timestamp, UNITS), st.builds(pa.timestamp, UNITS, ZONES), st.builds(pa.duration, UNITS),
    st.builds(pa.time32, st.sampled_from(["s", "ms"])), st.builds(pa.time64, st.sampled_from(["us", "ns"])),
    st.integers(1, 38).flatmap(lambda p: st.builds(pa.decimal128, st.just(p), st.integers(0, p))),
    st.integers(1, 76).flatmap(lambda p: st.builds(pa.decimal256, st.just(p), st.integers(0, p))),
    st.builds(pa.binary, st.integers(1, 64)),
)
NAMES = st.text(min_size=1, max_size=12).filter(lambda n: n not in ("time", "diff"))


@settings(max_examples=400, deadline=None)
@given(TYPES)
def test_every_relation_type_round_trips_through_its_text(t):
    assert parse_type(format_type(t)) == t
    assert parse_type(str(t)) == t  # pyarrow's own spelling reads too


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(NAMES, TYPES), min_size=1, max_size=6, unique_by=lambda f: f[0]))
def test_every_schema_round_trips_through_its_text(fields):
    schema = pa.schema(fields)
    spec = format_schema(schema)
    assert parse_schema_spec(spec) == schema
    assert "\t" not in spec and "\n" not in spec  # one field of `relation list`'s tab-separated line


def test_aliases_and_refusals():
    got = parse_schema_spec("a:int, b:INTEGER, c:bigint, d:long, e:decimal(10,2), f:decimal(40, 3), "
                            "g:timestamp[us, tz=UTC], h:time32[ms], i:time64[us], j:duration[ns], k:timestamp")
    assert list(zip(got.names, got.types, strict=True)) == [
        ("a", pa.int32()), ("b", pa.int32()), ("c", pa.int64()), ("d", pa.int64()), ("e", pa.decimal128(10, 2)),
        ("f", pa.decimal256(40, 3)), ("g", pa.timestamp("us", "UTC")), ("h", pa.time32("ms")),
        ("i", pa.time64("us")), ("j", pa.duration("ns")), ("k", pa.timestamp("us"))]
    for bad, words in [("a:decimal(10", "unknown type"), ("a:time32[us]", "s, ms"), ("a:time", "UNIT"),
                       ("a:timestamp[us,tz=Mars/Base]", "unknown time zone"), ("a:decimal(3,5)", "scale"),
                       ("a:decimal(x,1)", "precision"), ('"a:int64', "quoted name"), ("a:int,,b:int", "empty"),
                       ("a:float16", "unknown type"), ("a:int64,a:int32", "duplicate")]:
        with pytest.raises(SchemaMismatch) as refused:
            parse_schema_spec(bad)
        assert words in str(refused.value) and "\n" not in str(refused.value), (bad, str(refused.value))


def test_relation_list_output_feeds_relation_add(tmp_path):
    d = str(tmp_path / "data")
    every = ",".join(f"c{i}:{format_type(t)}" for i, (t, _values) in enumerate(WORKS.values()))
    given_spec = ("id:int,n:integer,price:decimal(10,2),at:timestamp[us, tz=UTC],t:time32[ms],t2:time64[us],"
                  f'd:duration[ns],"odd, name":bigint,{every}')
    added = sediment_cmd("--data-dir", d, "relation", "add", "orders", "--schema", given_spec)
    assert added.returncode == 0, added.stderr
    listed = sediment_cmd("--data-dir", d, "relation", "list")
    name, printed, *_frontiers = listed.stdout.rstrip("\n").split("\t")
    assert name == "orders" and listed.returncode == 0
    again = sediment_cmd("--data-dir", d, "relation", "add", "copy", "--schema", printed)
    assert again.returncode == 0, again.stderr
    with sediment.open(d) as engine:
        assert engine.schema("copy") == engine.schema("orders") == parse_schema_spec(given_spec)
        assert engine.schema("orders").field("price").type == pa.decimal128(10, 2)


# --- tail ---------------------------------------------------------------------------------------


def test_tail_count_counts_printed_rows_and_ends(tmp_path):
    d = seeded(tmp_path, rows=5)
    later = tmp_path / "later.csv"
    later.write_text("id,time,diff\n7,2,1\n8,2,1\n")
    assert cli_main(["--data-dir", d, "--no-progress", "append", "orders", str(later)]) == 0
    assert cli_main(["--data-dir", d, "seal", "orders", "2"]) == 0
    # a feed of three events (snapshot, updates, progress) printing 8 rows: counting events, --count 5
    # or 8 would wait for events that never come
    for count, kinds in [(3, ["snapshot"] * 3), (5, ["snapshot"] * 5),
                         (8, ["snapshot"] * 5 + ["update"] * 2 + ["progress"])]:
        proc = sediment_cmd("--data-dir", d, "tail", "orders", "--as-of", "1", "--count", str(count))
        assert proc.returncode == 0, proc.stderr
        header, *rows = proc.stdout.splitlines()
        assert header == "event,time,id,diff" and [r.split(",")[0] for r in rows] == kinds
    assert "positive integer" in sediment_cmd("--data-dir", d, "tail", "orders", "--count", "0").stderr


def test_a_tail_refused_prints_no_header(tmp_path):
    """``tail --as-of T`` past the sealed frontier is refused: the error alone, not a CSV header
    first that a script would take for an empty feed."""
    d = seeded(tmp_path, rows=2)
    proc = sediment_cmd("--data-dir", d, "tail", "orders", "--as-of", "99", "--count", "1")
    assert proc.returncode != 0 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "99" in proc.stderr, proc.stderr


def test_ctrl_c_exits_quietly_with_130(tmp_path):
    d = seeded(tmp_path, rows=1)
    proc = popen("--data-dir", d, "tail", "orders", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                 preexec_fn=sigint_as_at_a_terminal)
    out = lines_of(proc.stdout)
    assert out.get(timeout=RUN_TIMEOUT) == "event,time,id,diff\n"
    assert out.get(timeout=RUN_TIMEOUT).startswith("snapshot,")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=RUN_TIMEOUT) == 130
    assert proc.stderr.read() == ""


# The console script's own lines, with a real SIGINT sent to the process as the command's
# modules start loading (a Ctrl-C right after Enter, made to land at one place).
CTRL_C_WHILE_LOADING = """
import os, signal, sys

class CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == "sediment.cli.app":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, CtrlC())
from sediment.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_ctrl_c_while_the_command_loads_exits_quietly_with_130(tmp_path):
    """The modules of a command load for about 0.3 s (more on a loaded host); a Ctrl-C then
    printed a KeyboardInterrupt traceback from the console script's import line."""
    proc = subprocess.run([sys.executable, "-c", CTRL_C_WHILE_LOADING, "--data-dir", str(tmp_path), "stats"],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT, env=ENV,
                          preexec_fn=sigint_as_at_a_terminal)
    assert (proc.returncode, proc.stderr) == (130, ""), proc.stderr


@pytest.fixture
def served(tmp_path):
    """A real ``sediment serve`` on the seeded data directory: (process, port, token, data dir)."""
    d = seeded(tmp_path, rows=2)
    token = "t-" + os.urandom(8).hex()
    proc = popen("serve", "--data-dir", d, "--listen", "127.0.0.1:0", "--shutdown-grace", "5",
                 env={**ENV, "SEDIMENT_TOKEN": token}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = lines_of(proc.stdout)
    try:
        while not (line := out.get(timeout=RUN_TIMEOUT)).startswith("serving "):
            pass
        yield proc, int(line.rsplit(":", 1)[1]), token, d
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=RUN_TIMEOUT)


@pytest.mark.slow
def test_connect_takes_host_port_and_tail_hint_speaks_the_cli(served):
    proc, port, token, d = served
    listed = sediment_cmd("--connect", f"127.0.0.1:{port}", "--token", token, "relation", "list")
    assert listed.returncode == 0 and listed.stdout.startswith("orders\tid:int64\t"), listed.stderr
    bad = sediment_cmd("--connect", "127.0.0.1", "--token", token, "relation", "list")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "grpc://HOST:PORT" in bad.stderr, bad.stderr

    tail = popen("--connect", f"127.0.0.1:{port}", "--token", token, "tail", "orders", stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE)
    out = lines_of(tail.stdout)
    assert out.get(timeout=RUN_TIMEOUT) == "event,time,id,diff\n"
    sealed = sediment_cmd("--connect", f"127.0.0.1:{port}", "--token", token, "seal", "orders", "2")
    assert sealed.returncode == 0, sealed.stderr
    while (line := out.get(timeout=RUN_TIMEOUT)) != "progress,2,,\n":
        assert line.startswith("snapshot,1,"), line
    proc.send_signal(signal.SIGTERM)  # the server stops: the feed ends
    assert proc.wait(timeout=RUN_TIMEOUT) == 0
    assert tail.wait(timeout=RUN_TIMEOUT) == 1
    err = tail.stderr.read()
    assert err.count("\n") == 1 and "resume=True" not in err
    # the command named reaches the same server (never with the token), so it can be pasted
    assert f"`sediment --connect 127.0.0.1:{port} tail orders --as-of 2 --resume`" in err, err
    assert token not in err
    resumed = sediment_cmd("--data-dir", d, "tail", "orders", "--as-of", "2", "--resume", "--idle-timeout", "0.5")
    assert (resumed.returncode, resumed.stdout) == (0, "event,time,id,diff\n")  # no snapshot again


def test_a_tail_through_the_server_of_its_data_dir_names_that_data_dir_to_go_on(served):
    proc, _port, token, d = served
    tail = popen("--data-dir", d, "tail", "orders", env={**ENV, "SEDIMENT_TOKEN": token},
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = lines_of(tail.stdout)
    assert out.get(timeout=RUN_TIMEOUT) == "event,time,id,diff\n"
    assert sorted(out.get(timeout=RUN_TIMEOUT) for _ in range(2)) == ["snapshot,1,0,1\n", "snapshot,1,1,1\n"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=RUN_TIMEOUT) == 0
    assert tail.wait(timeout=RUN_TIMEOUT) == 1
    err = tail.stderr.read().splitlines()[-1]
    assert f"`sediment --data-dir {d} tail orders --as-of 1 --resume`" in err, err


def test_client_append_many_with_a_list_is_a_typed_error(tmp_path):
    token = os.urandom(8).hex()
    engine = sediment.open(tmp_path / "data")
    server = SedimentFlightServer(engine, "grpc://127.0.0.1:0", token, close_engine=True)
    try:
        engine.add_relation("r", pa.schema([("id", pa.int64())]))
        table = pa.table({"id": [1], "time": [1], "diff": [1]})
        with sediment.connect(f"127.0.0.1:{server.port}", token) as client:  # a bare HOST:PORT is grpc://
            for target in (client, engine):
                with pytest.raises(InvalidArgument) as refused:
                    target.append_many([("r", table)])
                assert "mapping of relation name" in str(refused.value) and "list" in str(refused.value)
            client.append_many({"r": table})
            with pytest.raises(InvalidArgument):
                sediment.connect("http://127.0.0.1:1", token)
        assert engine.trace_info("r")["tail_records"] == 1  # only the mapping's append
    finally:
        server.stop()


@pytest.mark.parametrize("options", [{"timeout": "5"}, {"timeout": -1}, {"token": 5}, {"tls_root_certs": 5},
                                     {"deadline": "soon"}])
def test_connect_options_are_typed_errors_before_any_connection(options):
    uri = "zk://127.0.0.1:1/c" if "deadline" in options else "grpc://127.0.0.1:1"  # nothing listens there
    with pytest.raises(InvalidArgument) as refused:
        sediment.connect(uri, **{"token": "t", **options})
    assert next(iter(options)) in str(refused.value)


# --- progress -------------------------------------------------------------------------------------


def test_progress_bar_on_a_terminal_nothing_on_a_pipe(tmp_path):
    d = seeded(tmp_path, rows=1)
    src = tmp_path / "more.csv"
    src.write_text("id,time,diff\n" + "".join(f"{i},2,1\n" for i in range(300)))
    piped = sediment_cmd("--data-dir", d, "append", "orders", str(src))
    assert (piped.returncode, piped.stderr) == (0, "")
    main_fd, term_fd = pty.openpty()
    fcntl.ioctl(term_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 100 columns, like a window
    try:
        proc = popen("--data-dir", d, "append", "orders", str(src), stdout=subprocess.PIPE, stderr=term_fd)
        os.close(term_fd)
        shown = b""
        while select.select([main_fd], [], [], RUN_TIMEOUT)[0]:
            try:
                chunk = os.read(main_fd, 4096)
            except OSError:  # EIO: the process closed the terminal
                break
            if not chunk:
                break
            shown += chunk
        assert proc.wait(timeout=RUN_TIMEOUT) == 0
    finally:
        os.close(main_fd)
    assert b"append more.csv" in shown and b"300/300" in shown and b"\r" in shown, shown


# --- serve: TLS files, busy ports, and no directory left behind ------------------------------------


def test_swapped_or_wrong_tls_files_are_named_before_serving(tmp_path, certificate):  # noqa: F811
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    cert_pem, key_pem, cert_file, key_file = certificate
    with sediment.open(tmp_path / "engine") as engine, pytest.raises(InvalidArgument) as refused:
        SedimentFlightServer(engine, "grpc://127.0.0.1:0", "t", tls=(key_pem, cert_pem))  # the API checks too
    assert "swapped" in str(refused.value) and "tls[0]" in str(refused.value)
    other, locked = tmp_path / "other.key", tmp_path / "locked.key"
    for path, how in ((other, serialization.NoEncryption()), (locked, serialization.BestAvailableEncryption(b"pw"))):
        path.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, how))
    d = tmp_path / "data"
    env = {**ENV, "SEDIMENT_TOKEN": "t"}
    for cert, key, words in [(key_file, cert_file, ["swapped", f"--tls-cert {key_file}", f"--tls-key {cert_file}"]),
                             (cert_file, str(other), ["is not the private key", f"--tls-key {other}"]),
                             (cert_file, cert_file, ["holds no PEM private key", f"--tls-key {cert_file}"]),
                             (cert_file, str(locked), ["encrypted with a passphrase", f"--tls-key {locked}"])]:
        proc = sediment_cmd("serve", "--data-dir", str(d), "--listen", "127.0.0.1:0", "--tls-cert", cert,
                            "--tls-key", key, env=env)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert all(w in proc.stderr for w in words) and "port" not in proc.stderr, proc.stderr
    assert not d.exists()


def test_failed_first_open_or_serve_leaves_no_directory(tmp_path, monkeypatch):
    new = tmp_path / "a" / "b" / "data"
    proc = sediment_cmd("--data-dir", str(new), "--blob", "nope://x", "relation", "add", "r", "--schema", "id:int64")
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert os.listdir(tmp_path) == []
    with pytest.raises(ValueError):
        sediment.open(new, blob="nope://x")
    assert os.listdir(tmp_path) == []

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = sediment_cmd("serve", "--data-dir", str(new), "--listen", f"127.0.0.1:{port}",
                            env={**ENV, "SEDIMENT_TOKEN": "t"})
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "another process" in proc.stderr
        assert os.listdir(tmp_path) == []
        # past the early check (another process took the port in between): Flight fails to
        # listen once the engine is open; the lock is released and a new directory removed
        monkeypatch.setattr(cli_serve, "_check_port_free", lambda host, port: None)
        serve = ["serve", "--token", "t", "--listen", f"127.0.0.1:{port}", "--data-dir"]
        assert cli_main([*serve, str(tmp_path / "fresh")]) == 1
        assert os.listdir(tmp_path) == []
        kept = seeded(tmp_path)
        assert cli_main([*serve, kept]) == 1
        with sediment.open(kept) as engine:
            assert engine.relations() == ["orders"]


@pytest.mark.parametrize("argv", [
    ["tail", "r", "--idle-timeout", "nan"],  # waited forever
    ["tail", "r", "--idle-timeout", "-1"],
    ["tail", "r", "--idle-timeout", "0"],
    ["serve", "--shutdown-grace", "-1"],  # was used as given
    ["serve", "--shutdown-grace", "inf"],
    ["serve", "--txn-idle-timeout", "nan"],
    ["cluster", "create", "--partitions", "2", "--session-timeout", "nan"],
])
def test_a_duration_that_is_not_a_finite_number_of_seconds_is_a_usage_error(tmp_path, capsys, monkeypatch, argv):
    monkeypatch.delenv("SEDIMENT_TOKEN", raising=False)
    d = tmp_path / "data"
    rc = cli_main(["--data-dir", str(d), *argv])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "invalid duration" in err, err
    assert argv[-2] in err and not d.exists()


def test_read_refuses_an_out_it_cannot_write_before_reading(tmp_path, capsys, monkeypatch):
    """A missing directory was found after the whole read, naming sediment's temporary file; a
    directory named like a CSV file failed at the rename."""
    d = seeded(tmp_path)
    capsys.readouterr()
    (tmp_path / "dir.csv").mkdir()
    monkeypatch.chdir(tmp_path)
    for out, words in [(str(tmp_path / "missing" / "x.csv"), ["--out", "no directory", "missing"]),
                       ("sub/../x.parquet", ["no directory sub/.."]),
                       (str(tmp_path / "dir.csv"), ["is a directory"])]:
        rc = cli_main(["--data-dir", d, "read", "orders", "--as-of", "1", "--out", out])
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and ".tmp-" not in err, err
        assert all(w in err for w in words), err
    assert sorted(os.listdir(tmp_path)) == ["data", "dir.csv", "seed.csv"] and os.listdir(tmp_path / "dir.csv") == []
    assert cli_main(["--data-dir", d, "read", "orders", "--as-of", "1", "--out", "dir.csv/x.csv"]) == 0
    assert (tmp_path / "dir.csv" / "x.csv").read_text().count("\n") == 6


def test_a_tail_ended_after_its_snapshot_names_the_command_that_goes_on(tmp_path):
    """A snapshot printed whole is the relation through its time, as a progress line is; a tail
    whose server stopped after one said only "run `sediment tail orders` again", which prints the
    whole relation again instead of going on."""
    d = seeded(tmp_path)
    token = os.urandom(8).hex()
    server = SedimentFlightServer(sediment.open(d), "grpc://127.0.0.1:0", token, close_engine=True)
    try:
        tail = popen("--connect", f"127.0.0.1:{server.port}", "--token", token, "tail", "orders",
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out = lines_of(tail.stdout)
        assert out.get(timeout=RUN_TIMEOUT) == "event,time,id,diff\n"
        assert sorted(out.get(timeout=RUN_TIMEOUT) for _ in range(5)) == [f"snapshot,1,{i},1\n" for i in range(5)]
    finally:
        server.stop()
    assert tail.wait(timeout=RUN_TIMEOUT) == 1
    err = tail.stderr.read()
    hint = f"`sediment --connect 127.0.0.1:{server.port} tail orders --as-of 1 --resume`"
    assert err.count("\n") == 1 and hint in err and "snapshot" in err and token not in err, err
    resumed = sediment_cmd("--data-dir", d, "tail", "orders", "--as-of", "1", "--resume", "--idle-timeout", "0.5")
    assert (resumed.returncode, resumed.stdout) == (0, "event,time,id,diff\n"), resumed.stderr


@pytest.fixture
def taken_port():
    """A port this process listens on: a serve that got past its argument checks fails at once
    (cannot listen), so a missing check shows as a wrong error, not a server that runs on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize("advertise", ["notaurl", "grpc://host", "grpc://host:0", "http://host:8815",
                                       "grpc://host:8815/x", "host:99999"])
def test_serve_refuses_an_advertised_address_clients_cannot_reach_and_joins_nothing(tmp_path, capsys, monkeypatch,
                                                                                     taken_port, advertise):
    """A member published ``--advertise`` as given: a word, a host without a port or port 0 went
    to ZooKeeper and every client sent to that member failed."""
    monkeypatch.setenv("SEDIMENT_TOKEN", "t")
    data = tmp_path / "member"
    code = cli_main(["serve", "--cluster", "zk://127.0.0.1:1/none", "--advertise", advertise, "--listen",
                     f"127.0.0.1:{taken_port}", "--data-dir", str(data)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and f"invalid --advertise {advertise!r}" in err
    assert not data.exists()


def test_serve_refuses_advertise_without_cluster_and_makes_nothing(tmp_path, capsys, monkeypatch, taken_port):
    monkeypatch.setenv("SEDIMENT_TOKEN", "t")
    data = tmp_path / "d"
    code = cli_main(["serve", "--advertise", "grpc://127.0.0.1:8815", "--listen", f"127.0.0.1:{taken_port}",
                     "--data-dir", str(data)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "--advertise grpc://127.0.0.1:8815 is the address of a cluster member" in err
    assert not data.exists()


MEMBER_STORAGE = {"--metadata": ("SEDIMENT_METADATA", "zk://127.0.0.1:1/other"),
                  "--blob": ("SEDIMENT_BLOB", "s3://bucket/prefix"),
                  "--s3-endpoint": ("AWS_ENDPOINT_URL", "http://127.0.0.1:1"),
                  "--wal": ("SEDIMENT_WAL", "s3://bucket/wal"),
                  "--replicas": (None, "127.0.0.1:7001"),
                  "--cluster-key": (None, "5e5e5e5e-0000-4000-8000-000000000001")}


@pytest.mark.parametrize("where", ["before serve", "after serve"])
@pytest.mark.parametrize("flag", sorted(MEMBER_STORAGE))
def test_serve_cluster_refuses_the_storage_options_its_record_holds_and_makes_nothing(tmp_path, capsys, monkeypatch,
                                                                                       taken_port, flag, where):
    """A member takes its metadata, blob store, S3 endpoint, storage nodes and their key from
    the cluster's record: given on the command line they were silently ignored. Refused even
    when the value is the one exported (it was typed for this command)."""
    monkeypatch.setenv("SEDIMENT_TOKEN", "t")
    variable, value = MEMBER_STORAGE[flag]
    if variable is not None:
        monkeypatch.setenv(variable, value)
    data = tmp_path / "member"
    serve = ["serve", "--cluster", "zk://127.0.0.1:1/none", "--listen", f"127.0.0.1:{taken_port}"]
    argv = [flag, value, "--data-dir", str(data), *serve] if where == "before serve" else [
        "--data-dir", str(data), *serve, flag, value]
    code = cli_main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert f"error: {flag}: a cluster member takes its storage" in err and "nothing was started" in err
    assert not data.exists()


def test_serve_cluster_ignores_storage_options_exported_in_the_environment(tmp_path, capsys, monkeypatch, taken_port):
    """A shell that exports $SEDIMENT_BLOB and the rest for its other commands can still start
    a member: the exported values are not refused (the serve goes on to listen, and fails on
    the taken port)."""
    monkeypatch.setenv("SEDIMENT_TOKEN", "t")
    for variable, value in MEMBER_STORAGE.values():
        if variable is not None:
            monkeypatch.setenv(variable, value)
    code = cli_main(["serve", "--cluster", "zk://127.0.0.1:1/none", "--listen", f"127.0.0.1:{taken_port}",
                     "--data-dir", str(tmp_path / "member")])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and f"cannot listen on 127.0.0.1:{taken_port}" in err, err


def test_serve_refuses_a_taken_metrics_port_before_it_makes_the_data_directory(tmp_path, capsys, monkeypatch,
                                                                               taken_port):
    """--metrics-listen on a taken port failed only after the engine was open: "Address already in
    use" alone, and a new data directory left behind."""
    monkeypatch.setenv("SEDIMENT_TOKEN", "t")
    data = tmp_path / "data"
    code = cli_main(["--data-dir", str(data), "serve", "--listen", "127.0.0.1:0",
                     "--metrics-listen", f"127.0.0.1:{taken_port}"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1, err
    assert f"cannot listen on 127.0.0.1:{taken_port} (--metrics-listen)" in err, err
    assert not data.exists()
    assert cli_main(["--data-dir", str(data), "serve", "--metrics-listen", "bogus"]) == 2
    err = capsys.readouterr().err
    assert "argument --metrics-listen: invalid address 'bogus'" in err and "--listen '" not in err, err


@pytest.mark.parametrize("given", [["--max-wal-backlog", "2000000"], ["--major-compaction-quiet", "5"],
                                   ["--take-over-blob-prefix"]])
def test_serve_cluster_refuses_options_of_one_engine_it_would_ignore(tmp_path, capsys, monkeypatch, taken_port, given):
    monkeypatch.setenv("SEDIMENT_TOKEN", "t")
    data = tmp_path / "member"
    code = cli_main(["serve", "--cluster", "zk://127.0.0.1:1/none", "--listen", f"127.0.0.1:{taken_port}",
                     "--data-dir", str(data), *given])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and f"{given[0]}: serve --cluster opens its partitions' engines" in err
    assert not data.exists()


@pytest.mark.parametrize(("argv", "help_of"), [
    (["relation", "list", "--json"], "sediment relation list"),
    (["stats", "--bogus"], "sediment stats"),
    (["--bogus", "stats"], "sediment stats"),
])
def test_an_unknown_argument_points_to_the_help_of_the_command_it_followed(argv, help_of, capsys, tmp_path):
    from sediment.cli import main

    assert main(["--data-dir", str(tmp_path / "d"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unrecognized arguments: --" in err and f"(see `{help_of} --help`)" in err, err
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("address", ["nonsense://x", "http://127.0.0.1:8815", "127.0.0.1:0", "host"])
def test_a_connect_address_that_cannot_be_read_is_a_usage_error(address, capsys, monkeypatch):
    from sediment.cli import main

    monkeypatch.setenv("SEDIMENT_TOKEN", "t")
    assert main(["--connect", address, "relation", "list"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("sediment: error: --connect: cannot read"), err
