"""The device ring's header copies and what they record: the trim point, the in-flight
window, the durable end as last recorded, and the copy sequence. :class:`RingHead` is the
one owner of those values; the log and its writer change them only by writing a copy."""

from __future__ import annotations

import threading

from sediment.errors import EngineClosed
from sediment.wal.device.block_io import RingFiles
from sediment.wal.device.format import RingHeader


class RingHead:
    """The header state of one ring. A new value (trim, window, durable end) takes effect
    only once the copy carrying it is durable, so readers of ``trim`` and ``window`` never
    see a value recovery could not find."""

    def __init__(self, files: RingFiles, block_size: int, window: int) -> None:
        self.files = files
        self.block_size = block_size
        self.capacity = 0
        self.seq = 0
        self.trim = 0
        self.window = window
        self.recorded_durable = 0
        self.writes = 0  # header copies written (for benchmarks)
        self._lock = threading.Lock()

    def load(self, hdr: RingHeader) -> None:
        """Take the values of the copy found at open."""
        self.capacity, self.seq, self.trim, self.recorded_durable = hdr.capacity, hdr.seq, hdr.trim, hdr.durable_end

    def write(self, shutdown: int, clean_end: int, durable: int, *, window: int | None = None,
              trim: int | None = None, exact: bool = False) -> None:
        """Write the next copy (wal/dual_slot.py). It records ``durable`` as the durable end, or
        the end recorded before if that is higher, unless ``exact`` (recovery sets the end it
        found, lower than before only after a repair). ``trim`` never moves back."""
        with self._lock:
            if self.files.fd < 0:
                raise EngineClosed(f"{self.files.path}: the WAL is closed")
            window = self.window if window is None else window
            trim = self.trim if trim is None else max(trim, self.trim)
            if not exact:
                durable = max(self.recorded_durable, durable)
            hdr = RingHeader(self.block_size, self.capacity, trim, self.seq + 1, window, shutdown, clean_end,
                             max(durable, trim))
            self.files.write_header(hdr)
            self.writes += 1
            self.seq, self.window, self.trim, self.recorded_durable = hdr.seq, window, trim, hdr.durable_end

    def close(self) -> None:
        """Close the ring's descriptors once no copy is being written."""
        with self._lock:
            self.files.close()
