"""TLS between clients and a served coordinator, with a certificate made here, and Flight's own
errors reaching callers as sediment's typed, one-line errors."""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading

import pyarrow as pa
import pytest

import sediment
from sediment.cli import main as cli_main
from sediment.client import Client
from sediment.errors import AuthenticationFailed, CoordinatorUnavailable, InvalidArgument
from sediment.net.tls import check_tls_files
from sediment.server import SedimentFlightServer

SCHEMA = pa.schema([("id", pa.int64())])


def test_tls_round_trip_and_typed_transport_errors(tmp_path, certificate):
    cert_pem, key_pem, _cert_file, _key_file = certificate
    token = os.urandom(8).hex()
    engine = sediment.open(tmp_path / "data")
    server = SedimentFlightServer(engine, "grpc://127.0.0.1:0", token, close_engine=True, tls=(cert_pem, key_pem))
    try:
        assert server.uri.startswith("grpc+tls://127.0.0.1:")
        with Client(server.uri, token, tls_root_certs=cert_pem) as client:
            client.add_relation("r", SCHEMA)
            client.append("r", pa.table({"id": [1, 2], "time": [1, 1], "diff": [1, 1]}))
            client.seal("r", 1)
            assert client.snapshot("r", 1).column("id").to_pylist() == [1, 2]
        with pytest.raises(AuthenticationFailed) as refused:
            Client(server.uri, "wrong-token", tls_root_certs=cert_pem)
        assert "\n" not in str(refused.value) and "token" in str(refused.value)
        plain = server.uri.replace("grpc+tls://", "grpc://")
        with pytest.raises(CoordinatorUnavailable):
            Client(plain, token, timeout=10)
    finally:
        server.stop()
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    with pytest.raises(CoordinatorUnavailable) as down:
        Client(f"grpc://127.0.0.1:{free}", token, timeout=10)
    assert "\n" not in str(down.value)


@pytest.mark.slow
def test_sediment_serve_with_tls_and_the_remote_cli(tmp_path, certificate, capsys):
    _cert_pem, _key_pem, cert_file, key_file = certificate
    token = os.urandom(8).hex()
    proc = subprocess.Popen([sys.executable, "-m", "sediment", "serve", "--data-dir", str(tmp_path / "data"),
                             "--listen", "127.0.0.1:0", "--tls-cert", cert_file, "--tls-key", key_file],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "SEDIMENT_TOKEN": token})
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        while not (line := lines.get(timeout=60)).startswith("serving "):
            pass
        uri = line.split()[-1]
        assert uri.startswith("grpc+tls://")
        remote = ["--connect", uri, "--token", token, "--tls-root-certs", cert_file]
        assert cli_main([*remote, "relation", "add", "r", "--schema", "id:int64"]) == 0
        assert cli_main([*remote, "relation", "list"]) == 0
        assert "r" in capsys.readouterr().out.split()
        assert cli_main(["--connect", uri, "--token", "nope", "--tls-root-certs", cert_file, "relation", "list"]) == 1
        err = capsys.readouterr().err
        assert "refused the token" in err and len(err.strip().splitlines()) == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


def test_a_failed_handshake_is_one_line_in_the_client_and_none_in_the_server(tmp_path, certificate):
    """A client without the server's CA (or a plain one) printed gRPC's "WARNING: All log messages
    before absl::InitializeLog()" and an INFO line before its own error, and the server printed
    the same for every such client; the untrusted certificate's error now says to give the CA."""
    _cert_pem, _key_pem, cert_file, key_file = certificate
    env = {k: v for k, v in os.environ.items() if k not in ("GRPC_VERBOSITY", "GRPC_EXPERIMENTS", "SEDIMENT_DEBUG")}
    env["SEDIMENT_TOKEN"] = os.urandom(8).hex()
    proc = subprocess.Popen([sys.executable, "-m", "sediment", "serve", "--data-dir", str(tmp_path / "data"),
                             "--listen", "127.0.0.1:0", "--tls-cert", cert_file, "--tls-key", key_file],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        while not (line := lines.get(timeout=60)).startswith("serving "):
            pass
        uri = line.split()[-1]
        for target, words in ((uri, "--tls-root-certs"), (uri.replace("grpc+tls://", "grpc://"), "TLS setting")):
            client = subprocess.run([sys.executable, "-m", "sediment", "--connect", target, "stats"], env=env,
                                    capture_output=True, text=True, timeout=60)
            assert client.returncode == 1 and client.stderr.count("\n") == 1 and words in client.stderr, client.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    server_err = proc.stderr.read()
    assert "absl" not in server_err and "andshake" not in server_err, server_err


def test_a_ca_file_that_cannot_be_read_is_invalid_argument_naming_the_option_and_path(tmp_path, certificate):
    """``tls_root_certs`` given as a file name that does not exist (or is a directory) is the
    caller's mistake: InvalidArgument naming the option and the path, before any connection,
    not a bare FileNotFoundError; the right file connects."""
    cert_pem, key_pem, cert_file, _key_file = certificate
    missing = tmp_path / "no-such-ca.pem"
    for path in (missing, tmp_path):
        with pytest.raises(InvalidArgument, match=f"tls_root_certs: cannot read the CA file '{path}'"):
            sediment.connect("grpc+tls://127.0.0.1:1", token="t", tls_root_certs=str(path))
    assert not missing.exists()
    engine = sediment.open(tmp_path / "data")
    server = SedimentFlightServer(engine, "grpc://127.0.0.1:0", "t", close_engine=True, tls=(cert_pem, key_pem))
    try:
        with sediment.connect(server.uri, token="t", tls_root_certs=str(cert_file)) as client:
            assert client.relations() == []
    finally:
        server.stop()


def test_a_ca_that_holds_no_certificate_is_invalid_argument_before_grpc_sees_it(tmp_path, certificate, capsys):
    """The server's key given as the CA (file or bytes) made gRPC log several lines of its own
    and fail the call with "empty address list", which reads as a network fault."""
    _cert_pem, key_pem, _cert_file, key_file = certificate
    with pytest.raises(InvalidArgument, match=f"the CA file '{key_file}' holds no PEM certificate .*found PRIVATE KEY"):
        sediment.connect("grpc+tls://127.0.0.1:1", token="t", tls_root_certs=key_file)
    with pytest.raises(InvalidArgument, match="holds no PEM certificate"):
        sediment.connect("grpc+tls://127.0.0.1:1", token="t", tls_root_certs=key_pem)
    assert cli_main(["--connect", "grpc+tls://127.0.0.1:1", "--token", "t", "--tls-root-certs", key_file, "stats"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds no PEM certificate" in err and key_file in err, err


def test_a_server_certificate_file_that_cannot_be_read_is_invalid_argument_naming_the_option(tmp_path, certificate):
    """``sediment serve --tls-cert`` naming no file said only "No such file or directory"."""
    _cert_pem, _key_pem, cert_file, key_file = certificate
    missing = tmp_path / "nope.pem"
    for cert, key, named in ((missing, key_file, "--tls-cert"), (cert_file, missing, "--tls-key")):
        with pytest.raises(InvalidArgument, match=f"{named} {missing}: cannot read it"):
            check_tls_files(str(cert), str(key), f"--tls-cert {cert}", f"--tls-key {key}")
    assert len(check_tls_files(str(cert_file), str(key_file), "--tls-cert", "--tls-key")) == 2
