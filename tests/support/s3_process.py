"""moto's S3 server and the proxy that serializes conditional requests, in a child process.

The ``moto_server`` fixture serves S3 from threads of the test's own process: fine while the
test's process is the only client, but a race between two processes (a writer in a child
appending back to back, an open in the test) is then skewed, since the test's thread shares
the interpreter lock with the threads serving the other process's requests. Here S3 is a
process of its own, as it is a service of its own in a deployment. Stopped (its stdin
closed, then SIGKILL) when the context ends.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import boto3

SERVER = """
import logging, sys
sys.path.insert(0, sys.argv[1])
logging.getLogger("werkzeug").setLevel(logging.WARNING)
from moto.server import ThreadedMotoServer
from support.faulty_proxy import FaultyProxy
moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
moto.start()
host, port = moto.get_host_and_port()
proxy = FaultyProxy(f"http://{host}:{port}", serialize_conditional=True, delay=float(sys.argv[2]))
print(f"http://{host}:{port}", proxy.endpoint, flush=True)
sys.stdin.read()
"""
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@contextmanager
def s3_process(bucket: str, delay: float = 0.0) -> Iterator[str]:
    """Start S3 in a child process with ``bucket`` made; yields the serializing proxy's
    endpoint, which adds ``delay`` seconds to every request (S3's latency). The environment
    must hold credentials (the ``moto_server`` fixture sets test ones)."""
    proc = subprocess.Popen([sys.executable, "-c", SERVER, TESTS, str(delay)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        direct, proxy = proc.stdout.readline().split()
        client = boto3.client("s3", endpoint_url=direct, region_name="us-east-1")
        client.create_bucket(Bucket=bucket)
        client.close()
        yield proxy
    finally:
        proc.stdin.close()
        proc.kill()
        proc.wait()
