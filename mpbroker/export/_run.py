"""`mpbroker export`: the stores' persistent messages to Parquet, incrementally."""

from __future__ import annotations

import contextlib
import fnmatch
import gc
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TextIO

from mpbroker.stores._segment import fsync_directory

from . import _parquet
from ._errors import ExportError
from ._manifest import (
    MANIFEST_NAME,
    Manifest,
    Options,
    after_seq,
    check_options,
    file_name,
    parse_manifest,
    record,
    source_key,
)
from ._schema import SourceMessage, build_row, kind_of
from ._source import find_stores, list_segments, pending_counts, read_outcomes, read_segment

__all__ = ["ExportSummary", "Progress", "export"]

_TMP_SUFFIX: Final = ".tmp"


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


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + _TMP_SUFFIX)
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_directory(path.parent)


def _prepare_out(out: Path, options: Options) -> Manifest:
    """Check the export directory (every file in it ours and known), clear leftovers of an
    interrupted run; the manifest to continue from."""
    if out.exists() and not out.is_dir():
        raise ExportError(out, "exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / MANIFEST_NAME
    if manifest_path.exists():
        manifest = parse_manifest(manifest_path.read_text(errors="replace"), manifest_path)
        check_options(manifest, options, manifest_path)
    else:
        manifest = Manifest(options)
    for path in sorted(out.rglob("*")):
        if path.is_file() and path.name.endswith(".parquet"):
            _parquet.check_file(path)
    # Only after every check: an interrupted run's temporary files (never complete).
    for path in out.rglob(f"*{_TMP_SUFFIX}"):
        if path.name.endswith((".parquet.tmp", MANIFEST_NAME + _TMP_SUFFIX)):
            path.unlink()
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


@_cyclic_gc_paused()
def export(
    data_dir: Path,
    out: Path,
    options: Options,
    progress: Callable[[int, int, int], None] | None = None,
) -> ExportSummary:
    """Export every persistent message of the stores in `data_dir` not exported to `out`
    yet: one Parquet file per source segment (and per later part of a segment that was
    active), then the manifest, after each segment. ExportError before anything is written
    when the input or the export directory is refused."""
    stores = find_stores(data_dir)
    _parquet.arrow_schema(options.body)  # ExportError with the install hint, up front
    manifest = _prepare_out(out, options)
    manifest_path = out / MANIFEST_NAME
    summary = ExportSummary()
    plans = [(store, list_segments(store)) for store in stores]
    total = sum(len(segments) for _, segments in plans)
    done = 0
    for store, segments in plans:
        # A message's settlement and delivery rows are in its own segment or later ones, so
        # segments before the first one to export are not read again (a long archive).
        todo = [after_seq(manifest, source_key(store.name, seg.index)) for seg in segments]
        first = next((i for i, after in enumerate(todo) if after is not None), len(segments))
        settlements, deliveries = read_outcomes(segments[first:])
        for seg in segments:
            done += 1
            key = source_key(store.name, seg.index)
            after = after_seq(manifest, key)
            if after is None:
                summary.segments_skipped += 1
                continue
            snapshot = read_segment(seg, after, body=options.body)
            if snapshot is None:
                continue
            summary.segments_read += 1
            chosen = [m for m in snapshot.messages if _selected(m, options)]
            pending: dict[int, int] = {}
            if chosen and any(kind_of(m.destination) == "topic" for m in chosen):
                pending = pending_counts(store.registry, chosen[0].seq, chosen[-1].seq)
            rows = [
                build_row(
                    m,
                    store=store.name,
                    segment=seg.index,
                    deliveries=deliveries.get(m.seq, 0),
                    settlement=settlements.get(m.seq),
                    pending_subscriptions=pending.get(m.seq, 0),
                    include_body=options.body,
                )
                for m in chosen
            ]
            written = None
            if rows:
                written = file_name(store.name, seg.index, after)
                _parquet.write_table(out / written, rows, options.body, key)
                summary.files_written += 1
                for m in chosen:
                    totals = summary.destinations.setdefault(m.destination, [0, 0])
                    totals[0] += 1
                    totals[1] += m.size
            upto = snapshot.messages[-1].seq if snapshot.messages else after
            if (
                written is not None
                or snapshot.sealed
                or upto != after
                or key not in manifest.segments
            ):
                manifest = record(
                    manifest,
                    key,
                    upto_seq=upto,
                    complete=snapshot.sealed,
                    rows=len(rows),
                    written=written,
                )
                _write_atomically(manifest_path, manifest.to_json())
            if progress is not None:
                progress(done, total, summary.rows)
    if not manifest_path.exists():
        _write_atomically(manifest_path, manifest.to_json())
    return summary
