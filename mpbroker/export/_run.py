"""`mpbroker export`: the stores' persistent messages to Parquet, incrementally, in bounded
memory.

A run does two things per store:

1. **Outcomes of earlier rows.** Every row file of an earlier run that still has pending
   rows: those rows are looked up in the stores, and the outcomes found since (acked,
   expired, dead-lettered, unsubscribed) are written to an update file beside it, which the
   ingest applies to its table.
2. **New rows.** Every segment not exported completely: its rows above what was exported,
   to a row file (the active segment's as a snapshot).

The manifest is rewritten after each file, so an interrupted run loses at most the file it
was writing (one renamed into place but not recorded yet is adopted by the next run). One
run at a time holds the export directory (a lock file in it). Segments are read batch by
batch and each batch's outcomes looked up by seq range, so memory depends on the batch
size, which `max_memory` sets, and not on the size of the stores.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import gc
import os
import re
import stat
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final, TextIO

import psutil

from mpbroker.config import format_bytes
from mpbroker.storefiles import fsync_directory

from . import _parquet
from ._errors import ExportError
from ._manifest import (
    LOCK_NAME,
    MANIFEST_NAME,
    OLD_MANIFEST_NAME,
    UPDATES_DIR,
    FileEntry,
    Manifest,
    Options,
    after_seq,
    check_options,
    file_name,
    parse_file_name,
    parse_manifest,
    record,
    record_updates,
    source_key,
    update_file_name,
)
from ._schema import PENDING, SETTLED_UNKNOWN, SourceMessage, build_row, kind_of
from ._source import (
    Batching,
    SegmentFile,
    StoreDir,
    StoreReader,
    find_stores,
    list_segments,
    pending_counts,
    read_segment,
)

__all__ = [
    "DEFAULT_MAX_MEMORY",
    "ExportSummary",
    "Progress",
    "anonymous_memory",
    "batching_for",
    "export",
]

DEFAULT_MAX_MEMORY: Final = 128 << 20
# Below this much room between what the process uses before it reads anything (Python,
# pyarrow) and `max_memory`, batches would be too small to be worth it.
_MIN_HEADROOM: Final = 24 << 20
# A batch of rows exists about this many times over at its peak: the messages read, the row
# dicts, the Arrow table and the encoded row group.
_BATCH_COPIES: Final = 8
_DEFAULT_BATCH: Final = Batching()
_SEGMENT_KEY: Final = re.compile(r"/seg-(\d+)$")


@dataclass(slots=True)
class ExportSummary:
    """What one run exported."""

    destinations: dict[str, list[int]] = field(default_factory=dict)
    """destination -> [rows, bytes] exported by this run."""
    files_written: int = 0
    segments_read: int = 0
    """Segments read (new ones, and the active segment's rows above what was exported)."""
    segments_skipped: int = 0
    """Segments exported completely by an earlier run, not read again."""
    outcomes_found: Counter[str] = field(default_factory=Counter)
    """outcome -> rows of earlier runs exported as pending whose outcome this run found."""
    still_pending: int = 0
    """Rows of earlier runs still pending after this run looked them up."""
    update_files: int = 0

    @property
    def rows(self) -> int:
        return sum(r for r, _ in self.destinations.values())

    @property
    def bytes(self) -> int:
        return sum(b for _, b in self.destinations.values())

    def lines(self) -> list[str]:
        """The summary table, one line per destination, then the totals."""
        width = max([len("destination"), *map(len, self.destinations)])
        out = [f"{'destination':<{width}}  {'rows':>10}  {'bytes':>14}"]
        for name in sorted(self.destinations):
            rows, size = self.destinations[name]
            out.append(f"{name:<{width}}  {rows:>10,}  {size:>14,}")
        out.append(f"{'total':<{width}}  {self.rows:>10,}  {self.bytes:>14,}")
        out.append(
            f"files written: {self.files_written}; segments read: {self.segments_read};"
            f" skipped (already exported): {self.segments_skipped}"
        )
        found = sum(self.outcomes_found.values())
        detail = ", ".join(f"{o} {n:,}" for o, n in sorted(self.outcomes_found.items()))
        out.append(
            f"earlier rows settled since: {found:,}{f' ({detail})' if detail else ''};"
            f" still pending: {self.still_pending:,}; update files written: {self.update_files}"
        )
        lost = self.outcomes_found.get(SETTLED_UNKNOWN, 0)
        if lost:
            out.append(
                f"warning: {lost:,} rows are '{SETTLED_UNKNOWN}': their segments were retired"
                " and deleted before this export saw their outcome (set store.archive = true"
                " to keep them)"
            )
        return out


class Progress:
    """Segments and rows so far, on one rewritten line of `stream` when it is a terminal."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.enabled = stream.isatty()

    WIDTH = 30

    def __call__(self, segment: int, segments: int, rows: int) -> None:
        if self.enabled:
            self.stream.write("\r" + self.line(segment, segments, rows))
            self.stream.flush()

    @classmethod
    def line(cls, segment: int, segments: int, rows: int) -> str:
        """``export [#########-----] 3/5 segments, 1,234 rows``"""
        filled = cls.WIDTH * segment // segments if segments else cls.WIDTH
        bar = "#" * filled + "-" * (cls.WIDTH - filled)
        return f"export [{bar}] {segment}/{segments} segments, {rows:,} rows"

    def done(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


def anonymous_memory() -> int:
    """The bytes this process holds that only it can hold: its resident set less the pages
    mapped from files (the Python and pyarrow libraries: 80 MB, shared with every process
    that maps them, dropped and read again by the kernel when memory is short)."""
    info = psutil.Process().memory_info()
    return int(info.rss - info.shared)


def batching_for(max_memory: int, in_use: int) -> Batching:
    """Batches small enough that a process already holding `in_use` bytes of anonymous
    memory stays under `max_memory`; ExportError naming --max-memory when that leaves too
    little room."""
    headroom = max_memory - in_use
    if headroom < _MIN_HEADROOM:
        raise ExportError(
            "--max-memory",
            f"{format_bytes(max_memory)} is too small: the export holds"
            f" {format_bytes(in_use)} before it reads anything (Python and pyarrow); give at"
            f" least {format_bytes(in_use + _MIN_HEADROOM)}",
        )
    # A batch is in memory several times over at its peak (its messages, rows, Arrow table
    # and encoded row group) beside the Parquet writer's 8 MB and SQLite's own: a tenth
    # (measured), up to the default batch (bigger ones are no faster).
    return Batching(bytes=min(_DEFAULT_BATCH.bytes, max(1 << 20, headroom // 10)))


def _write_atomically(path: Path, text: str) -> None:
    tmp = _parquet.temporary_name(path)
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_directory(path.parent)


def _is_leftover(path: Path) -> bool:
    """A temporary file of an interrupted run (never complete): hidden ``.NAME.tmp`` files,
    and the ``NAME.parquet.tmp`` / manifest temporaries of earlier versions."""
    name = path.name
    return (name.startswith(".") and name.endswith(".tmp")) or name.endswith(
        (".parquet.tmp", OLD_MANIFEST_NAME + ".tmp")
    )


@contextlib.contextmanager
def _locked(out: Path) -> Iterator[None]:
    """The export directory (made if need be), held for one run: an exclusive ``flock`` on
    ``OUT/_mpbroker-export.lock`` (kept, owner-only; the kernel drops the lock however the
    run ends). ExportError naming the directory at once while another export holds it: two
    runs would delete each other's files being written and take the same run number."""
    if out.exists() and not out.is_dir():
        raise ExportError(out, "exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK_NAME
    # O_NONBLOCK: a FIFO someone put there fails the check below instead of hanging us.
    flags = os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        raise ExportError(path, f"cannot open the export's lock file ({exc.strerror})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ExportError(path, "not a regular file: not the export's lock file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ExportError(
                out, "another mpbroker export is running into this directory; try again later"
            ) from None
        with contextlib.suppress(PermissionError):  # another user's file it may open
            os.fchmod(fd, 0o600)
        yield
    finally:
        os.close(fd)


def _prepare_out(out: Path, options: Options) -> Manifest:
    """Check the export directory (every file in it ours and known), adopt a row file an
    interrupted run wrote but did not record, clear its other leftovers; the manifest to
    continue from."""
    manifest_path = out / MANIFEST_NAME
    old_path = out / OLD_MANIFEST_NAME
    if manifest_path.exists():
        manifest = parse_manifest(manifest_path.read_text(errors="replace"), manifest_path)
    elif old_path.exists():
        manifest = parse_manifest(old_path.read_text(errors="replace"), old_path)
    else:
        manifest = Manifest(options)
    check_options(manifest, options, manifest_path if manifest_path.exists() else old_path)
    kinds = {
        path: _parquet.check_file(path)
        for path in sorted(out.rglob("*.parquet"))
        if path.is_file() and not path.name.startswith(".")
    }
    for path, kind in kinds.items():
        if (kind == _parquet.UPDATES) != path.relative_to(out).as_posix().startswith(
            UPDATES_DIR + "/"
        ):
            where = f"outside {UPDATES_DIR}/" if kind == _parquet.UPDATES else f"in {UPDATES_DIR}/"
            raise ExportError(path, f"an export file of kind {kind!r} {where}")
    for _, entry in manifest.open_files():  # the files this run reads
        for name in (entry.name, *entry.updates):
            if not (out / name).is_file():
                raise ExportError(
                    out / name,
                    "missing: the manifest lists it among the files of rows still pending;"
                    " restore it, or export into a new --out",
                )
    recorded = manifest.files()
    unrecorded = [
        path
        for path, kind in kinds.items()
        if kind == _parquet.ROWS and path.relative_to(out).as_posix() not in recorded
    ]
    manifest = _adopt(out, manifest, unrecorded)
    # Only after every check: an interrupted run's temporary files (never complete), and
    # the update files it wrote but did not record (the next one finds those outcomes again).
    for path in out.rglob("*.tmp"):
        if _is_leftover(path):
            path.unlink()
    recorded = manifest.files()
    for path, kind in kinds.items():
        if kind == _parquet.UPDATES and path.relative_to(out).as_posix() not in recorded:
            path.unlink()
    return manifest


def _adopt(out: Path, manifest: Manifest, paths: list[Path]) -> Manifest:
    """The manifest with the row files `paths` (in the export directory, not in the
    manifest) recorded as if the run that wrote them had recorded them.

    Such a file is complete (renamed into place only then) but its run was interrupted
    before it wrote the manifest. A reader may have taken it in already: it stays as it
    is, and later runs write update files for its pending rows, and export the segment's
    rows above its highest seq (the rows its run read and filtered out past that are read
    and filtered out again). ExportError naming a file that cannot be read, or that is not
    the file the manifest says comes next for its segment."""
    found = []
    for path in paths:
        name = path.relative_to(out).as_posix()
        parsed = parse_file_name(name)
        if parsed is None:
            continue  # not a name the export writes: left alone, as ever
        key, after = parsed
        found.append((key, after, name, path))
    for key, after, name, path in sorted(found):
        expected = after_seq(manifest, key)
        if expected != after:
            what = "nothing more" if expected is None else f"rows above seq {expected}"
            raise ExportError(
                path,
                f"a row file the manifest does not list, and not the next one of {key} (it"
                f" expects {what}): move it out of the export directory",
            )
        counts = _parquet.count_rows(path)
        written = FileEntry(name, counts.rows, counts.pending)
        manifest = record(
            manifest, key, upto_seq=max(after, counts.max_seq), complete=False, written=written
        )
    return manifest


@contextlib.contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """The export makes millions of short-lived objects without reference cycles, freed by
    reference counting; the cyclic collector's passes over them free nothing and took about
    30 % of the export's time (python -m bench.exportrate: 25.0 s with, 17.4 s without, for
    a million rows). Put back as it was afterwards."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _selected(message: SourceMessage, options: Options) -> bool:
    if options.destination is not None and not fnmatch.fnmatchcase(
        message.destination, options.destination
    ):
        return False
    return options.since_ms is None or message.timestamp_ms >= options.since_ms


@dataclass(slots=True)
class _Run:
    """One run's state: where it writes, what it has recorded, what it reports."""

    out: Path
    options: Options
    batching: Batching
    manifest: Manifest
    summary: ExportSummary = field(default_factory=ExportSummary)

    def save(self, manifest: Manifest) -> None:
        self.manifest = manifest
        _write_atomically(self.out / MANIFEST_NAME, manifest.to_json())


@_cyclic_gc_paused()
def export(
    data_dir: Path,
    out: Path,
    options: Options,
    progress: Callable[[int, int, int], None] | None = None,
    *,
    max_memory: int | None = None,
) -> ExportSummary:
    """Export every persistent message of the stores in `data_dir` not exported to `out`
    yet, and the outcomes found since of rows exported as pending: one Parquet row file per
    source segment (and per later part of a segment that was active), update files beside
    the row files, and the manifest after each file. ExportError before anything is
    written when the input, the export directory or `max_memory` is refused.

    `max_memory` bounds the whole process's anonymous memory (`mpbroker export
    --max-memory`; see `anonymous_memory`): the batches get what the process does not hold
    yet. None: batches of the default size (for a caller whose process holds other
    things)."""
    stores = find_stores(data_dir)
    _parquet.arrow_schema(options.body)  # ExportError with the install hint, up front
    if max_memory is None:
        batching = Batching()
    else:
        _parquet.use_system_allocator()
        batching = batching_for(max_memory, anonymous_memory())
    with _locked(out):
        manifest = _prepare_out(out, options)
        # The run's number is taken first: it names the update files, and a run interrupted
        # after recording one must not have its number (and that file's name) used again.
        run = _Run(out, options, batching, manifest)
        run.save(replace(manifest, runs=manifest.runs + 1))
        (out / OLD_MANIFEST_NAME).unlink(missing_ok=True)
        plans = [(store, list_segments(store)) for store in stores]
        total = sum(len(segments) for _, segments in plans)
        done = 0
        for store, segments in plans:
            reader = StoreReader(store, segments)
            try:
                _resolve_earlier_rows(run, store, reader)
                for seg in segments:
                    done += 1
                    _export_segment(run, store, reader, seg)
                    if progress is not None:
                        progress(done, total, run.summary.rows)
            finally:
                reader.close()
    return run.summary


def _resolve_earlier_rows(run: _Run, store: StoreDir, reader: StoreReader) -> None:
    """Look up the rows of earlier row files of `store` that were pending, and write the
    outcomes found to one update file per row file."""
    prefix = f"{store.name}/"
    for key, entry in run.manifest.open_files():
        if not key.startswith(prefix):
            continue
        path = run.out / entry.name
        if entry.pending is None:  # listed by a version 1 manifest: count it first
            counts = _parquet.count_rows(path)
            entry = replace(entry, rows=counts.rows, pending=counts.pending)
            if counts.pending == 0:
                run.save(
                    record_updates(
                        run.manifest, key, entry.name, pending=0, rows=counts.rows, update=None
                    )
                )
                continue
        match = _SEGMENT_KEY.search(key)
        assert match is not None  # source_key's format
        index = int(match.group(1))
        # Checked before the lookup: a segment deleted before it held only settled
        # messages, so a row of it found nowhere was settled, how is gone. (One that goes
        # during the lookup is looked up again by the next run.)
        gone = not reader.present(index)
        resolved = _parquet.update_seqs([run.out / u for u in entry.updates])
        name = update_file_name(entry.name, run.manifest.runs)
        still = 0
        schema = _parquet.arrow_schema(run.options.body, key, kind=_parquet.UPDATES)
        with _parquet.ParquetOut.open(run.out / name, schema) as updates:
            for keys in _parquet.pending_keys(path, resolved, run.batching.rows):
                found = reader.outcomes(index, keys.seq[0], keys.seq[-1], set(keys.seq))
                changes: list[dict[str, object]] = []
                for i, seq in enumerate(keys.seq):
                    settled = found.settlements.get(seq)
                    if settled is None and not gone:
                        still += 1
                        continue
                    outcome, at_ms = settled if settled is not None else (SETTLED_UNKNOWN, None)
                    run.summary.outcomes_found[outcome] += 1
                    changes.append(
                        {
                            "store": store.name,
                            "segment": keys.segment[i],
                            "seq": seq,
                            "message_id": keys.message_id[i],
                            "destination": keys.destination[i],
                            "timestamp": keys.timestamp_ms[i],
                            "outcome": outcome,
                            "settled_at": at_ms,
                            "redeliveries": found.deliveries.get(seq, 0),
                        }
                    )
                updates.write(changes)
            written = updates.commit()
        run.summary.still_pending += still
        run.summary.update_files += written
        run.save(
            record_updates(
                run.manifest,
                key,
                entry.name,
                pending=still,
                rows=entry.rows,
                update=name if written else None,
            )
        )


def _export_segment(run: _Run, store: StoreDir, reader: StoreReader, seg: SegmentFile) -> None:
    """Export the rows of `seg` not exported yet to one row file, and record it."""
    summary = run.summary
    key = source_key(store.name, seg.index)
    after = after_seq(run.manifest, key)
    if after is None:
        summary.segments_skipped += 1
        return
    name = file_name(store.name, seg.index, after)
    with read_segment(seg, after, run.batching, body=run.options.body) as read:
        if read is None:
            return
        summary.segments_read += 1
        upto = after
        pending_rows = 0
        schema = _parquet.arrow_schema(run.options.body, key)
        with _parquet.ParquetOut.open(run.out / name, schema) as rows_out:
            for batch in read.batches:
                upto = batch[-1].seq
                chosen = [m for m in batch if _selected(m, run.options)]
                if not chosen:
                    continue
                # A message's settlement and delivery rows are in its own segment or later
                # ones; its batch's seqs are one range.
                found = reader.outcomes(seg.index, batch[0].seq, upto)
                pending: dict[int, int] = {}
                if any(kind_of(m.destination) == "topic" for m in chosen):
                    pending = pending_counts(store.registry, chosen[0].seq, chosen[-1].seq)
                rows = [
                    build_row(
                        m,
                        store=store.name,
                        segment=seg.index,
                        deliveries=found.deliveries.get(m.seq, 0),
                        settlement=found.settlements.get(m.seq),
                        pending_subscriptions=pending.get(m.seq, 0),
                        include_body=run.options.body,
                    )
                    for m in chosen
                ]
                pending_rows += sum(1 for r in rows if r["outcome"] == PENDING)
                rows_out.write(rows)
                for m in chosen:
                    totals = summary.destinations.setdefault(m.destination, [0, 0])
                    totals[0] += 1
                    totals[1] += m.size
            sealed = read.sealed
            written = rows_out.commit()
    entry = FileEntry(name, rows_out.rows, pending_rows) if written else None
    summary.files_written += written
    if written or sealed or upto != after or key not in run.manifest.segments:
        run.save(record(run.manifest, key, upto_seq=upto, complete=sealed, written=entry))
