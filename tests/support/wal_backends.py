"""The four WriteAheadLog backends behind one face, for the conformance suites.

Each backend opens its log on real storage: the file log on segment files, the device ring
on a preallocated file standing in for the device (as tests/wal/test_device_wal.py does), the
replicated log on three real storage nodes (``StorageNode`` over ``FilePartitionStore``,
served on 127.0.0.1 by a trio thread in this process, so a suite stays fast) with its
partition metadata in a MemoryMetadataStore, the log on S3 on moto's server.
``crash_and_tear`` leaves the storage as a
crash in the middle of a write would: durable records, then half a frame. Each open hands
the log a preamble rebuilt from what it holds, as the engine does (``owned``).
"""

from __future__ import annotations

import functools
import os
import shutil
import threading
import time
import uuid
from pathlib import Path

import trio

from sediment.engine.frontiers import SealedFrontiers
from sediment.metadata.memory import MemoryMetadataStore
from sediment.wal import record as rec
from sediment.wal import segment as sg
from sediment.wal.device.log import DeviceLog
from sediment.wal.file_log import FileLog
from sediment.wal.protocol import WriteAheadLog
from sediment.wal.replication.node.storage_node import serve_tcp
from sediment.wal.replication.replicated_log import ReplicatedLog
from sediment.wal.s3_log import S3Log
from support.ports import POLL, RESTART_DEADLINE, PortTaken, address_in_use

KEY = uuid.UUID("c0f0c0f0-0000-4000-8000-00000000000e")
SEGMENT_BYTES = 8192
RING_BYTES = 1 << 20
BS = 4096


def half_frame(lsn: int) -> bytes:
    """The first half of a frame at ``lsn``: what a write cut by a crash leaves."""
    frame = rec.encode(rec.Record(rec.RecordKind.UPDATES, relation_id=9, t_lo=1, t_hi=1, count=1,
                                  body=b"never acknowledged" * 8), lsn)
    return frame[: len(frame) // 2]


def tear_segment_dir(pdir: Path) -> int:
    """Write half a frame right after the last record of the newest segment in ``pdir``;
    the offset it went to."""
    segs = sorted(p for p in os.listdir(pdir) if (sg.parse_name(p) or (0, ""))[1] == "seg")
    first = sg.parse_name(segs[-1])[0]
    path = pdir / segs[-1]
    scan = sg.scan_segment(str(path), first)
    with open(path, "r+b") as f:
        f.seek(scan.end)
        f.write(half_frame(scan.next_lsn))
        os.fsync(f.fileno())
    return scan.end


def owned(log: WriteAheadLog) -> WriteAheadLog:
    """``log`` with the engine's preamble set, rebuilt from every record it holds (as
    Engine._recover does): its segment boundaries carry the sealed frontiers."""
    book = SealedFrontiers()
    book.observe(list(log.scan()))
    log.set_preamble(book)
    return log


class FileBackend:
    name = "file"
    reports_torn_tails = True

    def __init__(self, root: Path) -> None:
        self.dir = root / "wal"
        self.created = False

    def open(self) -> WriteAheadLog:
        log = FileLog.open(str(self.dir), create=not self.created, segment_bytes=SEGMENT_BYTES)
        self.created = True
        return owned(log)

    def crash_and_tear(self, log: WriteAheadLog) -> None:
        """A copy of the directory taken while the log is open is what a crash leaves."""
        image = self.dir.parent / "crash-image"
        shutil.copytree(self.dir, image)
        log.close()
        shutil.rmtree(self.dir)
        image.rename(self.dir)
        tear_segment_dir(self.dir / "0")

    def stop(self) -> None:
        pass


class DeviceBackend:
    name = "device"
    reports_torn_tails = True

    def __init__(self, root: Path) -> None:
        self.path = root / "ring"
        self.created = False

    def open(self) -> WriteAheadLog:
        log = DeviceLog.open(self.path, RING_BYTES, create=not self.created, segment_bytes=SEGMENT_BYTES,
                             full_timeout=5.0)
        self.created = True
        return owned(log)

    def crash_and_tear(self, log: WriteAheadLog) -> None:
        end = max(r.lsn + r.frame_size for r in log.scan())
        image = self.path.read_bytes()  # the ring as a crash leaves it: the header says "running"
        log.close()
        data = RING_BYTES - 2 * BS
        nxt = -(-end // BS) * BS  # the next block a writer would have started
        with open(self.path, "r+b") as f:
            f.write(image)
            f.seek(2 * BS + nxt % data)
            f.write(half_frame(nxt))
            os.fsync(f.fileno())

    def stop(self) -> None:
        pass


class InProcessNodes:
    """``n`` storage nodes (the real request handling over segment files) on 127.0.0.1,
    served by one trio thread. ``stop`` cancels them as a kill would (no clean close)."""

    def __init__(self, root: Path, n: int = 3) -> None:
        self.dirs = [root / f"node{i}" for i in range(n)]
        self.ports = [0] * n
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self._failure: BaseException | None = None

    @property
    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.ports]

    def start(self) -> None:
        ready = threading.Event()

        async def main() -> None:
            with trio.CancelScope() as self._scope:
                async with trio.open_nursery() as nursery:
                    for i in range(len(self.dirs)):
                        listeners = await self._listen(nursery, i)
                        self.ports[i] = listeners[0].socket.getsockname()[1]
                    self._token = trio.lowlevel.current_trio_token()
                    ready.set()

        def run() -> None:
            try:
                trio.run(main)
            except BaseException as exc:  # noqa: BLE001 - reported by start()
                self._failure = exc
                ready.set()

        self._thread = threading.Thread(target=run, name="conformance-nodes", daemon=True)
        self._thread.start()
        assert ready.wait(RESTART_DEADLINE + 30), "storage nodes did not start"
        assert self._failure is None, f"storage nodes failed to start: {self._failure!r}"

    async def _listen(self, nursery: trio.Nursery, i: int) -> list:
        """Serve node ``i``: first on port 0, after a stop on the port it had, waiting while
        another process holds it (support.ports)."""
        port = self.ports[i]
        end = time.monotonic() + RESTART_DEADLINE
        while True:
            try:
                return await nursery.start(functools.partial(serve_tcp, str(self.dirs[i]), "127.0.0.1", port, KEY,
                                                             SEGMENT_BYTES))
            except Exception as exc:
                if port == 0 or not address_in_use(exc):
                    raise
            if time.monotonic() >= end:
                raise PortTaken(f"in-process storage node {i}: 127.0.0.1:{port} stayed taken by another process "
                                f"for {RESTART_DEADLINE}s; the restart at the same address failed")
            await trio.sleep(POLL)  # no event tells when another process lets a port go

    def stop(self) -> None:
        if self._thread is None:
            return
        assert self._token is not None and self._scope is not None
        self._token.run_sync_soon(self._scope.cancel)
        self._thread.join(30)
        assert not self._thread.is_alive()
        self._thread = None


class ReplicatedBackend:
    name = "replicated"
    reports_torn_tails = False  # the nodes cut and log them; the coordinator's log sees whole replicas

    def __init__(self, root: Path) -> None:
        self.nodes = InProcessNodes(root)
        self.nodes.start()
        self.meta = MemoryMetadataStore()

    def open(self) -> WriteAheadLog:
        return owned(ReplicatedLog.open(self.nodes.addresses, self.meta, 0, KEY, timeout=5.0,
                                        segment_bytes=SEGMENT_BYTES))

    def crash_and_tear(self, log: WriteAheadLog) -> None:
        log.close()
        self.nodes.stop()
        for d in self.nodes.dirs:
            tear_segment_dir(d / "0")
        self.nodes.start()

    def stop(self) -> None:
        self.nodes.stop()


class S3Backend:
    """The log on S3, on moto's server under a fresh prefix of one bucket per backend."""

    name = "s3"
    reports_torn_tails = False  # S3 stores objects whole: a crash mid-PUT leaves no object

    def __init__(self, root: Path, endpoint: str) -> None:
        import boto3

        self.endpoint = endpoint
        self.bucket = f"wal-{uuid.uuid4().hex[:16]}"
        self.client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        self.client.create_bucket(Bucket=self.bucket)
        self.spec = f"s3://{self.bucket}/log?endpoint={endpoint}"
        self.created = False

    def open(self) -> WriteAheadLog:
        log = S3Log.open(self.spec, create=not self.created, segment_bytes=SEGMENT_BYTES)
        self.created = True
        return owned(log)

    def crash_and_tear(self, log: WriteAheadLog) -> None:
        """S3 stores an object whole before it answers the PUT, so a crash mid-PUT leaves no
        object, and nothing short to cut; an object cut short afterwards is damage
        (tests/wal/test_s3_only.py, test_the_newest_object_cut_short_is_damage_not_a_torn_tail)."""
        log.close()

    def stop(self) -> None:
        self.client.close()


BACKENDS = {"file": FileBackend, "device": DeviceBackend, "replicated": ReplicatedBackend, "s3": S3Backend}
