"""The one recovery path of a file log: read a partition directory against its manifest.

Open (wal/file_log.py), ``sediment verify`` and ``sediment verify --repair`` all call
:func:`plan` (LevelDB's ``log::Reader`` with its ``Reporter`` is the model). It changes
nothing: it reads every segment, checks it against what the manifest says must be there,
and returns a :class:`Plan` -- the segments to keep, the files to delete as garbage, the
cuts to make -- plus every :class:`Problem` found. A torn tail beyond the recorded durable
end is a crash's normal leftover (not fatal); anything that loses acknowledged records
(a missing or shortened segment, damage with valid records after it, an active segment
ending before the durable end) is fatal unless ``repair``, and even then it is reported
with the LSN range and, where the surviving segments tell, the relations and times lost.
"""

from __future__ import annotations

import os
import threading
from array import array
from dataclasses import dataclass, field, replace

from sediment.errors import WalCorruption, WalMissing
from sediment.wal import segment as sg
from sediment.wal.manifest import FinishedSegment, Manifest


@dataclass
class Problem:
    """One thing the reader found. ``fatal``: open refuses without repair. ``lost``:
    records the log had acknowledged (below its recorded durable end, or in a segment the
    manifest records) are gone or unreadable."""

    kind: str  # torn_tail, garbage, unwritten, missing, shortened, damage, gap, hole, stray
    path: str
    offset: int
    first_lsn: int
    last_lsn: int
    reason: str
    fatal: bool = False
    lost: bool = False
    dropped_bytes: int = 0
    relations: dict[int, tuple[int, int]] = field(default_factory=dict)  # rel -> (sealed before, at most)

    def describe(self, names: dict[int, str] | None = None) -> str:
        """One line: file, offset, what, LSN range, bytes, and the relations (by name when
        ``names`` maps their ids) and times the range may have held."""
        lsns = f"LSNs [{self.first_lsn}, {self.last_lsn}]" if self.last_lsn >= self.first_lsn >= 0 else "no LSNs"
        names = names or {}

        def rel(r: int) -> str:
            return f"relation {names[r]!r} (id {r})" if r in names else f"relation id {r}"

        rels = "".join(f"; {rel(r)} times ({lo}, {hi}]" if hi >= 0 else f"; {rel(r)} times after {lo}"
                       for r, (lo, hi) in sorted(self.relations.items()))
        cut = f", {self.dropped_bytes} bytes" if self.dropped_bytes else ""
        return f"{self.path}: offset {self.offset}: {self.kind}: {self.reason} ({lsns}{cut}{rels})"

    def to_json(self) -> dict:
        return {"kind": self.kind, "path": self.path, "offset": self.offset, "first_lsn": self.first_lsn,
                "last_lsn": self.last_lsn, "reason": self.reason, "fatal": self.fatal, "lost": self.lost,
                "dropped_bytes": self.dropped_bytes,
                "relations": {str(r): {"sealed_before": lo, "at_most": hi} for r, (lo, hi) in self.relations.items()}}


@dataclass
class Plan:
    """What open does: keep ``segments`` (holes between them only where recorded or repaired),
    delete ``delete``, cut each ``cuts`` path at its offset (finished: to exactly that length,
    else zero-filled to the segment size), create an empty active segment at ``new_active``
    when set, then write ``manifest``."""

    segments: list[sg.SegmentScan] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    cuts: list[tuple[str, int, bool]] = field(default_factory=list)
    new_active: int | None = None
    salvage: list[tuple[str, int, int, int, str]] = field(default_factory=list)  # src, start, end, first LSN, new
    manifest: Manifest | None = None
    problems: list[Problem] = field(default_factory=list)

    @property
    def fatal(self) -> list[Problem]:
        return [p for p in self.problems if p.fatal]

    @property
    def lost(self) -> list[Problem]:
        return [p for p in self.problems if p.lost]


def refusal(directory: str, fatal: list[Problem], names: dict[int, str] | None = None) -> WalCorruption:
    """The typed error open raises for ``fatal`` findings: WalMissing when a file or its end
    is missing, else WalCorruption; names every file, offset, LSN range and relation."""
    first = fatal[0]
    text = "; ".join(p.describe(names) for p in fatal)
    if any(p.kind in ("missing", "shortened") for p in fatal):
        exc: WalCorruption = WalMissing(
            f"the write-ahead log at {directory} cannot be opened without losing acknowledged records: {text}. "
            "Restore the files, or run `sediment verify --repair` (with --force to accept the loss)",
            path=first.path, offset=first.offset, reason=first.reason, first_lsn=first.first_lsn,
            last_lsn=first.last_lsn)
    else:
        exc = WalCorruption(f"the write-ahead log at {directory} is damaged: {text}. Run `sediment verify --repair` "
                            "to keep every record that verifies (the records lost are reported)",
                            path=first.path, offset=first.offset, reason=first.reason)
    exc.problems = fatal  # type: ignore[attr-defined]
    exc.directory = directory  # type: ignore[attr-defined]
    return exc


def _looks_unwritten(path: str) -> bool:
    with open(path, "rb") as f:
        f.seek(sg.HEADER_SIZE)
        while chunk := f.read(1 << 20):
            if chunk.strip(b"\0"):
                return False
    return True


def list_segments(pdir: str) -> tuple[list[int], list[str]]:
    """The first LSNs of the ``.seg`` files, and leftover files to delete (temporaries,
    indexes whose data file is gone)."""
    found: dict[int, set[str]] = {}
    leftovers = []
    for name in sorted(os.listdir(pdir)) if os.path.isdir(pdir) else []:
        if name.endswith(".tmp"):
            leftovers.append(os.path.join(pdir, name))
            continue
        parsed = sg.parse_name(name)
        if parsed:
            found.setdefault(parsed[0], set()).add(parsed[1])
    leftovers += [os.path.join(pdir, sg.index_name(f)) for f, ext in found.items() if "seg" not in ext]
    return sorted(f for f, ext in found.items() if "seg" in ext), leftovers


def plan(pdir: str, manifest: Manifest, *, repair: bool = False, rebuilt: bool = False,
         keep_heads: bool = False) -> Plan:
    """Read the partition directory ``pdir`` against ``manifest``; change nothing.

    ``rebuilt``: the manifest was lost and ``manifest`` is a stand-in made by repair, so
    the segments on disk are taken as they are (each non-last one as finished).
    ``keep_heads``: each kept segment carries the headers (and COMMIT and FRONTIERS bodies) this read
    verified, so an open hands its caller the records without reading the log again.

    Each segment is read once, into one buffer reused for all of them, while the kernel
    reads the next one ahead (the disk streams while frames are checked)."""
    reader = _PlanReader(pdir, manifest, repair, rebuilt, keep_heads)
    reader.delete_below_start()
    reader.read_finished()
    if not reader.read_chain():
        return reader.out
    return reader.conclude()


class _PlanReader:
    """One read of a partition directory against its manifest: the state :func:`plan`
    builds up (the plan, the segments kept as finished, the read-ahead bookkeeping)."""

    def __init__(self, pdir: str, manifest: Manifest, repair: bool, rebuilt: bool, keep_heads: bool) -> None:
        self.pdir, self.m, self.repair, self.rebuilt, self.keep_heads = pdir, manifest, repair, rebuilt, keep_heads
        self.out = Plan()
        self.firsts, self.out.delete = list_segments(pdir)
        self.buf = sg.ReadBuffer()
        self.order: list[str] = []
        self.fetched: set[str] = set()
        self.position: dict[str, int] = {}
        self.finished: list[FinishedSegment] = []
        self.recorded = {f.first_lsn: f for f in manifest.finished if f.last_lsn >= manifest.start_lsn}
        if rebuilt:
            self.recorded = {}
            manifest.active_first = self.firsts[0] if self.firsts else manifest.active_first  # all files chain
        self.path_of = {f: os.path.join(pdir, sg.segment_name(f)) for f in self.firsts}
        self.key, self.part = manifest.cluster_key, manifest.partition

    def scan_file(self, path: str, first: int, **kw) -> sg.SegmentScan:
        if not self.position:
            self.position.update((p, i) for i, p in enumerate(self.order))
        i = self.position.get(path, len(self.order))
        ahead = [p for p in self.order[i:i + 2] if p not in self.fetched]
        if ahead:  # the hint blocks while it reads: in a thread, while this file is checked
            self.fetched.update(ahead)
            threading.Thread(target=_prefetch_all, args=(ahead,), name="wal-prefetch", daemon=True).start()
        return sg.scan_segment(path, first, keep_heads=self.keep_heads, buf=self.buf, **kw)

    def check_header(self, first: int, path: str) -> str:
        with open(path, "rb") as f:
            h = sg.parse_header(f.read(sg.HEADER_SIZE))
        if h is None or h.magic != sg.SEG_MAGIC:
            return "bad segment header"
        if h.first_lsn != first or h.partition != self.part:
            return f"header says first LSN {h.first_lsn}, partition {h.partition}"
        if h.cluster_key != self.key:
            return f"segment belongs to cluster {h.cluster_key}, not {self.key}"
        return ""

    def lose(self, kind: str, path: str, offset: int, lo: int, hi: int, reason: str, dropped: int = 0) -> None:
        self.out.problems.append(Problem(kind, path, offset, lo, hi, reason, fatal=True, lost=hi >= lo,
                                    dropped_bytes=dropped))

    def delete_below_start(self) -> None:
        """Segments wholly below the durable trim point: an interrupted trim's garbage."""
        for first in self.firsts:
            if first < self.m.start_lsn and first not in self.recorded:  # wholly below the durable trim point
                self.out.delete.append(self.path_of[first])
                self.out.delete.append(os.path.join(self.pdir, sg.index_name(first)))
                self.out.problems.append(Problem("garbage", self.path_of[first], 0, first, -1,
                                            "below the log's start (an interrupted trim); deleted"))

    def read_finished(self) -> None:
        """The finished segments the manifest records, then strays it does not."""
        self.order += [self.path_of[f] for f in sorted(self.recorded) if f in self.path_of]
        self.order += [self.path_of[f] for f in self.firsts if f >= self.m.active_first]
        for first in sorted(self.recorded):
            f = self.recorded[first]
            path = os.path.join(self.pdir, sg.segment_name(first))
            if first not in self.path_of:
                self.lose("missing", path, 0, f.first_lsn, f.last_lsn, "finished segment recorded in the manifest is missing")
                continue
            problem = self.check_header(first, path)
            if problem:
                self.lose("damage", path, 0, f.first_lsn, f.last_lsn, problem)
                continue
            scan = self.scan_file(path, first)
            size = scan.file_size
            kept_last = scan.next_lsn - 1
            if size < f.length or kept_last < f.last_lsn or not scan.clean:
                kind = "shortened" if size < f.length else "damage"
                why = (f"file is {size} bytes, recorded {f.length}" if size < f.length
                       else scan.reason or f"holds LSNs up to {kept_last}, recorded {f.last_lsn}")
                where = scan.bad_offset if scan.bad_offset >= 0 else scan.end
                self.lose(kind, path, where, kept_last + 1, f.last_lsn, why, max(0, size - scan.end))
                self.out.cuts.append((path, scan.end, True))
            elif size != f.length:
                self.out.problems.append(Problem("damage", path, f.length, -1, -1, f"file is {size} bytes, recorded "
                                            f"{f.length}: bytes after the last record", fatal=True))
                self.out.cuts.append((path, scan.end, True))
            if scan.offsets:
                scan.finished = True
                self.out.segments.append(scan)
                self.finished.append(FinishedSegment(first, kept_last, scan.end))
            _salvage(self.out, self.pdir, scan, self.finished, f.last_lsn, self.scan_file)
        for first in self.firsts:
            if self.m.start_lsn <= first < self.m.active_first and first not in self.recorded:
                self.out.problems.append(Problem("stray", self.path_of[first], 0, first, -1,
                                            "segment not recorded in the manifest; left untouched"))

    def read_chain(self) -> bool:
        """The active segment and those after it; False if the active one is missing and
        this is no repair (the plan is then final)."""
        chain = [f for f in self.firsts if f >= self.m.active_first]
        active_path = os.path.join(self.pdir, sg.segment_name(self.m.active_first))
        expect = self.m.active_first
        pending: Problem | None = None
        if not chain or chain[0] != self.m.active_first:
            hi = max(self.m.durable_end - 1, self.m.active_first - 1)
            self.lose("missing", active_path, 0, self.m.active_first, hi, "active segment recorded in the manifest is missing")
            if not self.repair:
                self.out.manifest = self.m
                return False
        self.drop_unwritten(chain)
        for i, first in enumerate(chain):
            path = self.path_of[first]
            is_last = i == len(chain) - 1
            problem = self.check_header(first, path)
            if pending is not None:
                pending.last_lsn = first - 1
                pending = None
            elif first != expect and (i > 0 or first < expect):
                self.lose("gap", path, 0, expect, first - 1, f"segment starts at LSN {first}, the previous one ends "
                     f"before {expect}")
            if problem:
                self.lose("damage", path, 0, first, max(first, self.m.durable_end) - 1, problem)
                continue
            scan = self.scan_file(path, first)
            if not scan.clean:
                torn = is_last and not scan.valid_after_bad and scan.next_lsn >= self.m.durable_end
                if torn:
                    self.out.problems.append(Problem("torn_tail", path, scan.bad_offset, scan.next_lsn, -1,
                                                f"a crash's torn tail: {scan.reason}; cut",
                                                dropped_bytes=scan.file_size - scan.bad_offset))
                elif is_last and not scan.valid_after_bad:
                    self.lose("shortened", path, scan.bad_offset, scan.next_lsn, self.m.durable_end - 1,
                         f"active segment ends at LSN {scan.next_lsn} ({scan.reason}), before the durable end "
                         f"{self.m.durable_end} the log recorded", scan.file_size - scan.bad_offset)
                else:
                    where = "valid records follow it" if scan.valid_after_bad else "a later segment exists"
                    self.lose("damage", path, scan.bad_offset, scan.next_lsn, max(scan.next_lsn, self.m.durable_end) - 1,
                         f"{scan.reason}; {where}", scan.file_size - scan.bad_offset)
                    pending = self.out.problems[-1]
                self.out.cuts.append((path, scan.bad_offset, not is_last or scan.resume is not None))
            elif not is_last and scan.file_size > scan.end:  # finished by a later segment: cut to its records
                self.out.cuts.append((path, scan.end, True))
            done = not is_last or scan.resume is not None  # salvaged records after damage follow it
            scan.finished = done
            self.out.segments.append(scan)
            if done and scan.offsets:
                self.finished.append(FinishedSegment(first, scan.next_lsn - 1, scan.end))
            expect = scan.next_lsn
            if scan.resume is not None:
                expect = _salvage(self.out, self.pdir, scan, self.finished, max(scan.next_lsn, self.m.durable_end) - 1, self.scan_file)
                pending = None
                if is_last and expect < self.m.durable_end and self.out.problems[-1].last_lsn < self.m.durable_end - 1:
                    self.lose("shortened", path, scan.file_size, expect, self.m.durable_end - 1,
                         f"the records that verify end at LSN {expect}, before the durable end {self.m.durable_end}")
        return True

    def drop_unwritten(self, chain: list[int]) -> None:
        """A roll killed before the new segment's header was written leaves that file
        unwritten: it is deleted and leaves ``chain`` *before* the chain is read, so the
        segment before it is read as the last one (still active), never as finished."""
        while chain and chain[-1] > self.m.active_first:
            path = self.path_of[chain[-1]]
            if not self.check_header(chain[-1], path) or not _looks_unwritten(path):
                return
            self.out.delete += [path, os.path.join(self.pdir, sg.index_name(chain[-1]))]
            self.out.problems.append(Problem("unwritten", path, 0, chain.pop(), -1,
                                             "segment created but its header never became durable; deleted"))

    def keep_last_active(self) -> None:
        """A segment is finished only if a kept segment follows it: when nothing will follow
        the last kept one (no repair's new active segment), it stays the active segment, so it
        is never recorded as finished at one length and then grown as the active file."""
        last = self.out.segments[-1] if self.out.segments else None
        if last is None or not last.finished or self.out.fatal or self.out.new_active is not None:
            return
        last.finished = False
        self.finished = [f for f in self.finished if f.first_lsn != last.first_lsn]
        self.out.cuts = [(p, o, fin and p != last.path) for p, o, fin in self.out.cuts]

    def conclude(self) -> Plan:
        """What the chain's end says about the durable end; a repair's new active segment;
        the new manifest."""
        end = self.out.segments[-1].next_lsn if self.out.segments else self.m.active_first
        active_kept = bool(self.out.segments) and not self.out.segments[-1].finished and self.out.segments[-1].first_lsn >= self.m.active_first
        if active_kept and end < self.m.durable_end and not any(p.fatal and p.path == self.out.segments[-1].path
                                                           for p in self.out.problems):
            self.lose("shortened", self.out.segments[-1].path, self.out.segments[-1].end, end, self.m.durable_end - 1,
                 f"active segment ends at LSN {end}, before the durable end {self.m.durable_end} the log recorded")
        if self.repair and (not active_kept or end < self.m.durable_end):
            if active_kept:  # the damaged active segment becomes self.finished; appends resume past the loss
                last = self.out.segments[-1]
                last.finished = True
                self.out.cuts = [c for c in self.out.cuts if c[0] != last.path] + [(last.path, last.end, True)]
                if last.offsets:
                    self.finished.append(FinishedSegment(last.first_lsn, last.next_lsn - 1, last.end))
                else:
                    self.out.segments.pop()
                    self.out.delete += [last.path, os.path.join(self.pdir, sg.index_name(last.first_lsn))]
            self.out.new_active = max(end, self.m.durable_end, self.m.active_first)
        self.keep_last_active()
        _attribute(self.out)
        if self.out.segments and not self.repair and not self.rebuilt:
            start = self.m.start_lsn
        else:
            start = self.out.segments[0].first_lsn if self.out.segments else (self.out.new_active or self.m.active_first)
        active_first = self.out.new_active if self.out.new_active is not None else (
            self.out.segments[-1].first_lsn if self.out.segments else self.m.active_first)
        self.out.manifest = Manifest(self.key, self.part, start, active_first, self.m.generation, self.finished, self.m.durable_end, self.m.end_sequence)
        return self.out


def _prefetch_all(paths: list[str]) -> None:
    for path in paths:
        sg.prefetch(path)


def _salvage(out: Plan, pdir: str, scan: sg.SegmentScan, finished: list[FinishedSegment], hi: int,
             scan_file=sg.scan_segment) -> int:
    """Keep the records that verify after damage in ``scan``'s file: each run of valid frames
    becomes a segment of its own (``out.salvage``, written by a repairing open before the
    source is cut), and the damage's loss shrinks to the LSNs truly unreadable. ``hi``: the
    last LSN the damaged range could reach. Returns the LSN after the last kept record."""
    lost = out.problems[-1] if out.problems and out.problems[-1].path == scan.path else None
    cur, end = scan, scan.next_lsn
    while cur.resume is not None:
        pos, lsn = cur.resume
        if lost is not None:
            lost.last_lsn = lsn - 1
            lost.lost = lost.last_lsn >= lost.first_lsn
        run = scan_file(scan.path, lsn, start=pos)
        new_path = os.path.join(pdir, sg.segment_name(lsn))
        length = run.end - pos + sg.HEADER_SIZE
        out.salvage.append((scan.path, pos, run.end, lsn, new_path))
        offsets = array("Q", (o - pos + sg.HEADER_SIZE for o in run.offsets))
        out.segments.append(replace(run, path=new_path, offsets=offsets, end=length, finished=True))
        finished.append(FinishedSegment(lsn, run.next_lsn - 1, length))
        end = run.next_lsn
        lost = None
        if run.resume is not None:
            out.problems.append(Problem("damage", scan.path, run.bad_offset, run.next_lsn, hi,
                                        f"{run.reason}; valid records follow it", fatal=True, lost=True))
            lost = out.problems[-1]
        cur = run
    return end


def _attribute(out: Plan) -> None:
    """For each lost LSN range, the relations whose sealed frontier moved across it and by
    how much (from the surviving segments on either side): the times that may be lost."""
    for p in out.problems:
        if not p.lost:
            continue
        before: dict[int, int] = {}
        after: dict[int, int] = {}
        for s in out.segments:
            if s.next_lsn <= p.first_lsn:
                for r, t in s.sealed.items():
                    before[r] = max(before.get(r, -1), t)
            elif s.first_lsn > p.last_lsn and not after:
                after = dict(s.sealed)
        for r in sorted(set(before) | set(after)):
            lo, hi = before.get(r, -1), after.get(r, before.get(r, -1))
            if not after or hi > lo:
                p.relations[r] = (lo, hi if after else -1)
