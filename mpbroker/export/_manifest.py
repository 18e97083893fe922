"""The export manifest: which source segments were exported, up to which seq. Pure.

The manifest (``OUT/mpbroker-export.json``) is what makes a repeated export incremental and
duplicate-free: a sealed or archived segment exported once is `complete` and never read
again; the active segment's rows are exported up to the highest seq seen (`upto_seq`), and
the next run exports only the rows above it, whether the segment was sealed meanwhile or not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from ._errors import ExportError
from ._schema import SCHEMA_VERSION

__all__ = [
    "MANIFEST_FORMAT",
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "Manifest",
    "Options",
    "SegmentEntry",
    "after_seq",
    "check_options",
    "file_name",
    "parse_manifest",
    "record",
    "source_key",
]

MANIFEST_NAME: Final = "mpbroker-export.json"
MANIFEST_FORMAT: Final = "mpbroker-export"
MANIFEST_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class Options:
    """What selects and shapes the rows; an export directory keeps the ones it was made with
    (changing them would leave rows missing or columns differing between files)."""

    destination: str | None = None
    since_ms: int | None = None
    body: bool = True


@dataclass(frozen=True, slots=True)
class SegmentEntry:
    upto_seq: int
    """Every message row of the segment with seq <= this was read (exported or filtered)."""
    complete: bool
    """The segment was sealed when read: nothing more will ever come from it."""
    rows: int
    """Rows exported from it so far."""
    files: tuple[str, ...]
    """Files written for it, relative to the export directory."""


@dataclass(frozen=True, slots=True)
class Manifest:
    options: Options
    segments: dict[str, SegmentEntry] = field(default_factory=dict)
    """Keyed by source, ``<store>/seg-<index>`` (e.g. ``p2p-0/seg-00000001``)."""

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
            "segments": {
                key: {
                    "upto_seq": e.upto_seq,
                    "complete": e.complete,
                    "rows": e.rows,
                    "files": list(e.files),
                }
                for key, e in sorted(self.segments.items())
            },
        }
        return json.dumps(data, indent=1) + "\n"


def source_key(store: str, index: int) -> str:
    return f"{store}/seg-{index:08d}"


def parse_manifest(text: str, path: Path) -> Manifest:
    """A manifest from its JSON; ExportError naming `path` when it is damaged, foreign, or
    of a manifest or schema version this code does not know."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ExportError(path, f"damaged manifest (not JSON: {exc})") from None
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        raise ExportError(path, "not an mpbroker export manifest")
    version = data.get("manifest_version")
    if version != MANIFEST_VERSION:
        raise ExportError(
            path, f"manifest version {version!r} unknown (this mpbroker knows {MANIFEST_VERSION})"
        )
    schema = data.get("schema_version")
    if schema != SCHEMA_VERSION:
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
        segments = {
            str(key): SegmentEntry(
                upto_seq=int(e["upto_seq"]),
                complete=bool(e["complete"]),
                rows=int(e["rows"]),
                files=tuple(str(f) for f in e["files"]),
            )
            for key, e in data["segments"].items()
        }
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ExportError(path, f"damaged manifest ({type(exc).__name__}: {exc})") from None
    return Manifest(options, segments)


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
    writes the same name again next time, so a leftover is replaced, never duplicated."""
    stem = f"{store}/seg-{index:08d}"
    return f"{stem}.parquet" if after == 0 else f"{stem}.after-{after}.parquet"


def record(
    manifest: Manifest,
    key: str,
    *,
    upto_seq: int,
    complete: bool,
    rows: int,
    written: str | None,
) -> Manifest:
    """The manifest after exporting source `key` up to `upto_seq` (`written`: the file made,
    None when no row was selected)."""
    old = manifest.segments.get(key, SegmentEntry(0, False, 0, ()))
    entry = replace(
        old,
        upto_seq=max(old.upto_seq, upto_seq),
        complete=complete,
        rows=old.rows + rows,
        files=(*old.files, written) if written is not None else old.files,
    )
    return replace(manifest, segments={**manifest.segments, key: entry})
