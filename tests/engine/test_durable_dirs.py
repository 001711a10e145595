"""Issue 12, finding 8: every directory the engine creates is durable before the call that
created it returns. Under POSIX a new directory entry survives a power cut only once its
parent directory is fsynced, so a `mkdir` without that sync can lose the catalog, the log
or a batch's folder even though every file inside was synced.

The test records the real system calls of a workload in this process (mkdir, and fsync
of directory descriptors, resolved to their paths) and checks, for each call of the
public API, that every directory it created had its parent synced before it returned.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

import sediment


class _Recorder:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[tuple[str, str]] = []
        self._paths: dict[int, str] = {}
        real_open, real_close, real_mkdir, real_fsync = os.open, os.close, os.mkdir, os.fsync

        def open_(path, flags, *args, **kwargs):
            fd = real_open(path, flags, *args, **kwargs)
            self._paths[fd] = os.path.abspath(os.fsdecode(path)) if not kwargs.get("dir_fd") else "?"
            return fd

        def close(fd):
            self._paths.pop(fd, None)
            return real_close(fd)

        def mkdir(path, *args, **kwargs):
            real_mkdir(path, *args, **kwargs)
            self.events.append(("mkdir", os.path.abspath(os.fsdecode(path))))

        def fsync(fd):
            real_fsync(fd)
            path = self._paths.get(fd if isinstance(fd, int) else fd.fileno())
            if path is not None and os.path.isdir(path):
                self.events.append(("fsync_dir", path))

        monkeypatch.setattr(os, "open", open_)
        monkeypatch.setattr(os, "close", close)
        monkeypatch.setattr(os, "mkdir", mkdir)
        monkeypatch.setattr(os, "fsync", fsync)

    def unsynced_dirs(self, since: int) -> list[str]:
        """Directories created after event ``since`` whose parent was not fsynced after it."""
        events = self.events[since:]
        missing = []
        for i, (kind, path) in enumerate(events):
            if kind == "mkdir":
                parent = os.path.dirname(path)
                if ("fsync_dir", parent) not in events[i + 1:]:
                    missing.append(path)
        return missing


@pytest.mark.embedded_only
def test_every_directory_the_engine_creates_is_durable_before_the_call_returns(tmp_path, monkeypatch):
    recorder = _Recorder(monkeypatch)
    root = tmp_path / "deep" / "data"  # parents that do not exist yet are created (and synced) too
    blobs = tmp_path / "elsewhere" / "blobs"
    schema = pa.schema([("id", pa.int64())])
    created: set[str] = set()

    def call(what, fn, *args, **kwargs):
        start = len(recorder.events)
        result = fn(*args, **kwargs)
        assert recorder.unsynced_dirs(start) == [], f"{what} returned with unsynced directories"
        created.update(p for k, p in recorder.events[start:] if k == "mkdir")
        return result

    engine = call("open", sediment.open, root, blob=f"file://{blobs}", compact_interval=None)
    try:
        call("add_relation", engine.add_relation, "r", schema)
        call("append", engine.append, "r", pa.table({"id": [1, 2], "time": [1, 1], "diff": [1, 1]}))
        call("seal", engine.seal, "r", 1)
        call("compact", engine.compact)
        call("append", engine.append, "r", pa.table({"id": [3], "time": [2], "diff": [1]}))
        call("seal", engine.seal, "r", 2)
        call("compact", engine.compact)
    finally:
        engine.close()
    # the workload did create the directories the finding names: the data dir and its parents,
    # meta/, wal/ and wal/0/, the blob root and a trace folder under it
    assert {str(tmp_path / "deep"), str(root), str(root / "meta"), str(root / "wal"), str(blobs)} <= created
    assert any(p.startswith(str(blobs) + os.sep) for p in created), "no batch folder was created"
