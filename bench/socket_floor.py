"""The floor of a plain loopback TCP transport for served appends, beside gRPC + Flight's
(``bench/serve.py``'s ``served-bare``), measured in the same run, rounds interleaved.

Why: issue 27's served appends need the transport under ~45-50 us of CPU per 100 KB append
on both sides together; gRPC + Flight alone take 234-393 us. Before building a channel of
our own, this measures what a bare socket round trip of the same 1,000-row appends costs:
each client process serializes its batch (``RecordBatch.serialize``), sends a 16-byte
length-prefixed header and the body with one ``sendmsg``, and waits for a 2-byte ack; the
server's thread per connection ``recv_into`` a buffer, decodes it zero-copy
(``pa.ipc.read_record_batch`` with the schema known per connection) and acks. Nothing is
written (as ``served-bare``). Prints CPU per append of the server process and of the
clients, every case, each round. Session 28 built such a channel into the server and did
not keep it (docs/benchmarks.md, "Session 28" under "Appends over the network").

    .venv/bin/python bench/socket_floor.py --rounds 3 --seconds 3
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import struct
import sys
import threading
import time

import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve  # noqa: E402 - the benchmark's tables and the gRPC peer

HEADER = struct.Struct("<4sIQ")  # magic, metadata length, body length


def _recv_exact(sock: socket.socket, view: memoryview) -> bool:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            return False
        got += n
    return True


def _serve_conn(conn: socket.socket, counts: list[int]) -> None:
    head = bytearray(HEADER.size)
    hv = memoryview(head)
    with conn:
        while _recv_exact(conn, hv):
            _, _, size = HEADER.unpack(head)
            body = pa.allocate_buffer(size)
            if not _recv_exact(conn, memoryview(body)):
                return
            batch = pa.ipc.read_record_batch(body, serve.UPDATES)
            counts[0] += batch.num_rows
            conn.sendall(b"ok")


def _client(port: int, k: int, ready, go, seconds: float, out) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    tables = serve.FreshTables(k)
    ack = bytearray(2)

    def append(table: pa.Table) -> None:
        body = table.to_batches()[0].serialize()
        sock.sendmsg([HEADER.pack(b"SDAP", 0, body.size), body])
        if not _recv_exact(sock, memoryview(ack)):
            raise ConnectionError("server gone")

    append(tables.next())
    ready.put(k)
    go.wait()
    cpu0, main0 = time.process_time(), time.thread_time()
    t0 = time.perf_counter()
    deadline = t0 + seconds
    n = 0
    while time.perf_counter() < deadline:
        append(tables.next())
        n += serve.BATCH_ROWS
    out.put((n, t0, time.perf_counter(), time.process_time() - cpu0, 0, time.thread_time() - main0))
    sock.close()


def run_socket(clients: int, seconds: float) -> dict:
    ctx = mp.get_context("spawn")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    counts = [0]
    conns: list[threading.Thread] = []

    def accept() -> None:
        for _ in range(clients):
            conn, _ = listener.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            t = threading.Thread(target=_serve_conn, args=(conn, counts), daemon=True)
            t.start()
            conns.append(t)

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_client, args=(port, k, ready, go, seconds, out), daemon=True)
             for k in range(clients)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=120)
    cpu0 = time.process_time()
    go.set()
    results = [out.get(timeout=seconds + 120) for _ in procs]
    server_cpu = time.process_time() - cpu0
    for p in procs:
        p.join(timeout=60)
    for t in conns:
        t.join(timeout=10)
    listener.close()
    rows = sum(r[0] for r in results)
    appends = max(1, rows // serve.BATCH_ROWS)
    elapsed = max(r[2] for r in results) - min(r[1] for r in results)
    return {"rows_s": rows / elapsed, "cpu_us": server_cpu / appends * 1e6,
            "client_cpu_us": sum(r[3] for r in results) / appends * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--clients", default="4,16")
    args = parser.parse_args()
    import tempfile
    cases = ("socket", "served-bare")
    got: dict[tuple[str, int], list[dict]] = {}
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}", flush=True)
    for r in range(args.rounds):
        for n in map(int, args.clients.split(",")):
            for case in cases[r % len(cases):] + cases[:r % len(cases)]:
                res = run_socket(n, args.seconds) if case == "socket" else \
                    serve.run_served(tempfile.gettempdir(), n, args.seconds, how=case)
                got.setdefault((case, n), []).append(res)
                print(f"round {r + 1}: {case:18s} {n:2d} clients: {res['rows_s'] / 1e3:7.0f}k rows/s, per append "
                      f"server {res['cpu_us']:.0f} us, clients {res['client_cpu_us']:.0f} us, "
                      f"both {res['cpu_us'] + res['client_cpu_us']:.0f} us; load {os.getloadavg()[0]:.1f}", flush=True)
    print()
    for (case, n), runs in got.items():
        both = [x["cpu_us"] + x["client_cpu_us"] for x in runs]
        print(f"{case:18s} {n:2d} clients: both sides {statistics.median(both):.0f} us "
              f"({min(both):.0f}-{max(both):.0f}) per append, server "
              f"{statistics.median(x['cpu_us'] for x in runs):.0f}, clients "
              f"{statistics.median(x['client_cpu_us'] for x in runs):.0f}")


if __name__ == "__main__":
    main()
