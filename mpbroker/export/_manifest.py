"""The export manifest: which source segments were exported, up to which seq, and which of
the rows exported as pending have had their outcome exported since. Pure.

The manifest (``OUT/_mpbroker-export.json``; the leading underscore makes Spark and pyarrow
skip it when they read the directory as a dataset) is what makes a repeated export
incremental and duplicate-free: a sealed or archived segment exported once is `complete`
and never read again; the active segment's rows are exported up to the highest seq seen
(`upto_seq`), and the next run exports only the rows above it, whether the segment was
sealed meanwhile or not. Each row file keeps its count of rows still `pending`; a later run
looks those up in the stores and writes the outcomes found to an update file, until none
is pending (the file is then `resolved`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from ._errors import ExportError
from ._schema import READABLE_SCHEMA_VERSIONS, SCHEMA_VERSION

__all__ = [
    "LOCK_NAME",
    "MANIFEST_FORMAT",
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "OLD_MANIFEST_NAME",
    "UPDATES_DIR",
    "FileEntry",
    "Manifest",
    "Options",
    "SegmentEntry",
    "after_seq",
    "check_options",
    "file_name",
    "parse_file_name",
    "parse_manifest",
    "record",
    "record_updates",
    "source_key",
    "update_file_name",
]

MANIFEST_NAME: Final = "_mpbroker-export.json"
# Manifest version 1's name: Spark's and pyarrow's dataset readers tried to read it as data.
OLD_MANIFEST_NAME: Final = "mpbroker-export.json"
MANIFEST_FORMAT: Final = "mpbroker-export"
# 2: per row file its rows, pending rows and update files; `runs`.
MANIFEST_VERSION: Final = 2
_READABLE_MANIFEST_VERSIONS: Final = frozenset({1, 2})
UPDATES_DIR: Final = "_updates"
LOCK_NAME: Final = "_mpbroker-export.lock"
"""What a run holds an flock on, so that one runs at a time (skipped by dataset readers)."""
_FILE_NAME: Final = re.compile(r"^([^/]+)/seg-(\d{8})(?:\.after-(\d+))?\.parquet$")


@dataclass(frozen=True, slots=True)
class Options:
    """What selects and shapes the rows; an export directory keeps the ones it was made with
    (changing them would leave rows missing or columns differing between files)."""

    destination: str | None = None
    since_ms: int | None = None
    body: bool = True


@dataclass(frozen=True, slots=True)
class FileEntry:
    """A row file and what became of its pending rows."""

    name: str
    """Relative to the export directory."""
    rows: int
    pending: int | None
    """Rows exported as pending whose outcome no update file holds yet; None: not counted
    yet (a file a version 1 manifest listed)."""
    updates: tuple[str, ...] = ()
    """Update files written for its rows, oldest first."""


@dataclass(frozen=True, slots=True)
class SegmentEntry:
    upto_seq: int
    """Every message row of the segment with seq <= this was read (exported or filtered)."""
    complete: bool
    """The segment was sealed when read: nothing more will ever come from it."""
    files: tuple[FileEntry, ...]
    """Row files written for it."""

    @property
    def rows(self) -> int:
        """Rows exported from it so far."""
        return sum(f.rows for f in self.files)


@dataclass(frozen=True, slots=True)
class Manifest:
    options: Options
    segments: dict[str, SegmentEntry] = field(default_factory=dict)
    """Keyed by source, ``<store>/seg-<index>`` (e.g. ``p2p-0/seg-00000001``)."""
    runs: int = 0
    """Runs completed; the next one is ``runs + 1`` (it names the update files it writes)."""

    def to_json(self) -> str:
        data: dict[str, Any] = {
            "format": MANIFEST_FORMAT,
            "manifest_version": MANIFEST_VERSION,
            "schema_version": SCHEMA_VERSION,
            "options": {
                "destination": self.options.destination,
                "since_ms": self.options.since_ms,
                "body": self.options.body,
            },
            "runs": self.runs,
            "segments": {
                key: {
                    "upto_seq": e.upto_seq,
                    "complete": e.complete,
                    "files": [
                        {
                            "name": f.name,
                            "rows": f.rows,
                            "pending": f.pending,
                            "updates": [*f.updates],
                        }
                        for f in e.files
                    ],
                }
                for key, e in sorted(self.segments.items())
            },
        }
        return json.dumps(data, indent=1) + "\n"

    def open_files(self) -> list[tuple[str, FileEntry]]:
        """(segment key, row file) for every row file with rows still pending (or not counted
        yet), in segment order."""
        return [
            (key, f)
            for key, entry in sorted(self.segments.items())
            for f in entry.files
            if f.pending is None or f.pending > 0
        ]

    def files(self) -> set[str]:
        """Every file the manifest names (row files and update files)."""
        return {
            name
            for entry in self.segments.values()
            for f in entry.files
            for name in (f.name, *f.updates)
        }


def source_key(store: str, index: int) -> str:
    return f"{store}/seg-{index:08d}"


def parse_manifest(text: str, path: Path) -> Manifest:
    """A manifest from its JSON (version 1 or 2); ExportError naming `path` when it is
    damaged, foreign, or of a manifest or schema version this code does not know."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ExportError(path, f"damaged manifest (not JSON: {exc})") from None
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        raise ExportError(path, "not an mpbroker export manifest")
    version = data.get("manifest_version")
    if version not in _READABLE_MANIFEST_VERSIONS:
        raise ExportError(
            path, f"manifest version {version!r} unknown (this mpbroker knows {MANIFEST_VERSION})"
        )
    schema = data.get("schema_version")
    if schema not in READABLE_SCHEMA_VERSIONS:
        raise ExportError(
            path, f"schema version {schema!r} unknown (this mpbroker writes {SCHEMA_VERSION})"
        )
    try:
        opts = data["options"]
        since = opts["since_ms"]
        options = Options(
            destination=opts["destination"],
            since_ms=None if since is None else int(since),
            body=bool(opts["body"]),
        )
        segments = {str(key): _segment_entry(e, version) for key, e in data["segments"].items()}
        runs = int(data.get("runs", 0))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ExportError(path, f"damaged manifest ({type(exc).__name__}: {exc})") from None
    return Manifest(options, segments, runs)


def _segment_entry(e: dict[str, Any], version: int) -> SegmentEntry:
    if version == 1:
        # Version 1 kept the segment's row count and file names only: each file's rows and
        # pending rows are counted from the file when the export next runs.
        files = tuple(FileEntry(str(name), 0, None) for name in e["files"])
    else:
        files = tuple(
            FileEntry(
                str(f["name"]),
                int(f["rows"]),
                None if f["pending"] is None else int(f["pending"]),
                tuple(str(u) for u in f["updates"]),
            )
            for f in e["files"]
        )
    return SegmentEntry(int(e["upto_seq"]), bool(e["complete"]), files)


def check_options(manifest: Manifest, options: Options, path: Path) -> None:
    """ExportError unless `options` are the ones the export directory was made with."""
    if manifest.options != options:
        raise ExportError(
            path,
            f"this export directory was made with {manifest.options}, not {options}:"
            " use another --out for different options",
        )


def after_seq(manifest: Manifest, key: str) -> int | None:
    """Export the rows of source `key` with seq above this; None: nothing more can come from
    it (a complete segment)."""
    entry = manifest.segments.get(key)
    if entry is None:
        return 0
    if entry.complete:
        return None
    return entry.upto_seq


def file_name(store: str, index: int, after: int) -> str:
    """The file for rows of segment `index` above seq `after` (relative to the export dir).

    Deterministic: a run interrupted between the file's rename and the manifest's write
    left the file the next run would write, under this name; the next run adopts it (a
    reader may have taken it in already) rather than write it again."""
    stem = f"{store}/seg-{index:08d}"
    return f"{stem}.parquet" if after == 0 else f"{stem}.after-{after}.parquet"


def parse_file_name(name: str) -> tuple[str, int] | None:
    """(source key, after) of a row file name `file_name` makes; None for any other name."""
    m = _FILE_NAME.match(name)
    if m is None:
        return None
    store, index, after = m.group(1), int(m.group(2)), int(m.group(3) or 0)
    if file_name(store, index, after) != name:  # e.g. ".after-0", or a leading zero
        return None
    return source_key(store, index), after


def update_file_name(row_file: str, run: int) -> str:
    """The update file run `run` writes for the rows of `row_file`, under ``_updates/``:
    a dataset reader of the export directory (Spark, pyarrow) skips names starting with an
    underscore, so the row files read as one table of one schema."""
    return f"{UPDATES_DIR}/{row_file.removesuffix('.parquet')}.updates-{run}.parquet"


def record(
    manifest: Manifest,
    key: str,
    *,
    upto_seq: int,
    complete: bool,
    written: FileEntry | None,
) -> Manifest:
    """The manifest after exporting source `key` up to `upto_seq` (`written`: the row file
    made, None when no row was selected)."""
    old = manifest.segments.get(key, SegmentEntry(0, False, ()))
    kept = tuple(f for f in old.files if written is None or f.name != written.name)
    entry = SegmentEntry(
        upto_seq=max(old.upto_seq, upto_seq),
        complete=complete,
        files=(*kept, written) if written is not None else old.files,
    )
    return replace(manifest, segments={**manifest.segments, key: entry})


def record_updates(
    manifest: Manifest, key: str, row_file: str, *, pending: int, rows: int, update: str | None
) -> Manifest:
    """The manifest after looking up the pending rows of `row_file` (of source `key`):
    `pending` of them still pending, `rows` in the file, `update` the update file written
    (None when no outcome was found)."""
    entry = manifest.segments[key]
    files = tuple(
        replace(
            f,
            rows=rows,
            pending=pending,
            updates=(*f.updates, update) if update is not None else f.updates,
        )
        if f.name == row_file
        else f
        for f in entry.files
    )
    return replace(manifest, segments={**manifest.segments, key: replace(entry, files=files)})
