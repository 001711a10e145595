"""A blob store in a local directory: one file per object.

Writes go to a temporary file beside the target, are fsynced, and are renamed into
place (then the directory is fsynced), so a crash leaves either the old object, the
new object, or an orphaned temporary file that :meth:`FileBlobStore.sweep_temporaries`
removes, never a torn object under a real key.

Limitation: a key cannot be both an object and a "directory" of other keys here
(``a`` and ``a/b``), because the file system cannot; S3 and memory allow it.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import threading
import time
from pathlib import Path

from sediment._fs import fsync_dir as _fsync_dir
from sediment._fs import makedirs_durable, write_all
from sediment.errors import BlobAlreadyExists, BlobError, BlobNotFound

from .keys import TEMP_SUFFIX, open_key, validate_range


class FileBlobStore:
    """Objects as files under ``root`` (created if missing); keys map to relative paths."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).absolute()
        try:
            makedirs_durable(self.root)
        except OSError as e:
            raise BlobError(
                f"cannot create blob directory {str(self.root)!r}: {e.strerror}; "
                "check the path and its permissions"
            ) from e
        self._closed = False
        self._mkdir_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"FileBlobStore({str(self.root)!r})"

    def _where(self, key: str) -> str:
        return f"key {key!r} in blob directory {str(self.root)!r}"

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*open_key(self._closed, self._where(key), key).split("/"))

    def _io_error(self, op: str, key: str, e: OSError) -> BlobError:
        return BlobError(
            f"{op} of {self._where(key)} failed: {e.strerror or e} ({e.filename or ''}); "
            "check free space and permissions; nothing was written under the key"
        )

    def _ensure_parent(self, path: Path, key: str) -> None:
        """Create missing parent directories, fsyncing each new entry's parent for durability."""
        with self._mkdir_lock:
            try:
                makedirs_durable(path.parent)
            except FileExistsError as e:
                raise BlobError(
                    f"cannot store {self._where(key)}: {e.filename!r} is an object, not a directory "
                    "(the file store cannot hold both 'a' and 'a/b'); choose another key"
                ) from None

    def _write_temp(self, path: Path, key: str, data: bytes) -> Path:
        self._ensure_parent(path, key)
        tmp = path.with_name(f"{path.name}.{secrets.token_hex(8)}{TEMP_SUFFIX}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            write_all(fd, data)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        os.close(fd)
        return tmp

    def get(self, key: str) -> bytes:
        return self._read("get", key, 0, -1)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        validate_range(key, start, length)
        return self._read("get_range", key, start, length)

    def _read(self, op: str, key: str, start: int, length: int) -> bytes:
        """``length`` bytes (-1: all) from ``start`` of the object's file."""
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                f.seek(start)
                return f.read(length)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise BlobNotFound(f"no object at {self._where(key)}") from None
        except OSError as e:
            raise self._io_error(op, key, e) from e

    def local_path(self, key: str) -> str:
        """The file holding ``key``, so readers can open it with pyarrow's native file instead
        of copying it through Python (they still check it against the trace state)."""
        return str(self._path(key))

    def size(self, key: str) -> int:
        path = self._path(key)
        try:
            st = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            raise BlobNotFound(f"no object at {self._where(key)}") from None
        except OSError as e:
            raise self._io_error("size", key, e) from e
        if not path.is_file():
            raise BlobNotFound(f"no object at {self._where(key)}")
        return st.st_size

    def put(self, key: str, data: bytes) -> None:
        self._store(key, data, if_absent=False)

    def put_if_absent(self, key: str, data: bytes) -> None:
        self._store(key, data, if_absent=True)

    def _store(self, key: str, data: bytes, *, if_absent: bool) -> None:
        """Write ``data`` to a temporary file, fsync it, then rename it over the key (``put``) or
        link it to the key, which fails if the key exists (``put_if_absent``)."""
        op = "put_if_absent" if if_absent else "put"
        path = self._path(key)
        try:
            tmp = self._write_temp(path, key, data)
            try:
                self._place(tmp, path, key, if_absent)
            finally:
                tmp.unlink(missing_ok=True)  # gone after a rename
            _fsync_dir(path.parent)
        except BlobError:
            raise
        except OSError as e:
            raise self._io_error(op, key, e) from e

    def _place(self, tmp: Path, path: Path, key: str, if_absent: bool) -> None:
        """Rename ``tmp`` over ``path``, or link it there when ``if_absent`` (which fails if the key exists)."""
        try:
            if if_absent:
                os.link(tmp, path)
            else:
                os.replace(tmp, path)
        except FileExistsError:
            if path.is_dir():
                raise BlobError(
                    f"cannot store {self._where(key)}: it is a directory of other keys "
                    "(the file store cannot hold both 'a' and 'a/b'); choose another key"
                ) from None
            raise BlobAlreadyExists(
                f"an object already exists at {self._where(key)}; put_if_absent never replaces one"
            ) from None

    def spill_path(self) -> str:
        """A fresh temporary file name inside the store (same file system, so :meth:`put_file`
        can link it into place; swept like any other temporary if a crash leaves it)."""
        makedirs_durable(self.root)
        return str(self.root / f"spill-{secrets.token_hex(8)}{TEMP_SUFFIX}")

    def put_file(self, key: str, path: str, *, if_absent: bool = False) -> None:
        """Store the contents of the local file ``path`` under ``key`` without reading it into
        memory: fsync it, then link it into place (copying only across file systems)."""
        target = self._path(key)
        try:
            self._ensure_parent(target, key)
            src = Path(path)
            if src.parent.resolve() != target.parent.resolve():
                tmp = target.with_name(f"{target.name}.{secrets.token_hex(8)}{TEMP_SUFFIX}")
                try:
                    os.link(src, tmp)
                except OSError:  # another file system: copy
                    shutil.copyfile(src, tmp)
            else:
                tmp = src
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                self._place(Path(tmp), target, key, if_absent)
            finally:
                if tmp != src:
                    Path(tmp).unlink(missing_ok=True)
            _fsync_dir(target.parent)
        except BlobError:
            raise
        except OSError as e:
            raise self._io_error("put_file", key, e) from e

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return
        except OSError as e:
            if e.errno == errno.EPERM and path.is_dir():
                return
            raise self._io_error("delete", key, e) from e
        _fsync_dir(path.parent)

    def _walk(self, prefix: str) -> list[tuple[str, Path]]:
        """(relative key, path) of every regular file under the part of the tree ``prefix`` can reach."""
        start = self.root
        head = prefix.rpartition("/")[0]
        if head:
            parts = head.split("/")
            if any(p in ("", ".", "..") or "\\" in p or "\x00" in p for p in parts):
                return []
            start = self.root.joinpath(*parts)
        found: list[tuple[str, Path]] = []
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames.sort()
            rel = os.path.relpath(dirpath, self.root)
            base = "" if rel == "." else rel.replace(os.sep, "/") + "/"
            for name in filenames:
                found.append((base + name, Path(dirpath, name)))
        return found

    def list(self, prefix: str = "") -> list[str]:
        if self._closed:
            raise BlobError(f"list of prefix {prefix!r} in {str(self.root)!r}: the store is closed")
        return sorted(
            k for k, _ in self._walk(prefix) if k.startswith(prefix) and not k.endswith(TEMP_SUFFIX)
        )

    def sweep_temporaries(self, min_age_seconds: float = 0.0) -> list[str]:
        """Delete orphaned temporary files left by writes a crash interrupted.

        Returns their paths relative to the root. Run it at startup before any writer,
        or pass ``min_age_seconds`` (longer than any write takes) so that files of writes
        still in flight are left alone.
        """
        if self._closed:
            raise BlobError(f"sweep of {str(self.root)!r}: the store is closed")
        cutoff = time.time() - min_age_seconds
        removed: list[str] = []
        for rel, path in self._walk(""):
            if not rel.endswith(TEMP_SUFFIX):
                continue
            try:
                if min_age_seconds > 0 and path.stat().st_mtime > cutoff:
                    continue
                path.unlink()
            except FileNotFoundError:
                continue
            removed.append(rel)
        for parent in {self.root.joinpath(*r.split("/")).parent for r in removed}:
            _fsync_dir(parent)
        return sorted(removed)

    def close(self) -> None:
        self._closed = True
