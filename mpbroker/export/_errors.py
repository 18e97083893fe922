"""Errors of the export."""

from __future__ import annotations

from pathlib import Path

__all__ = ["ExportError"]


class ExportError(Exception):
    """The export refused its input or output; names the file and why.

    Raised before anything is written for a data directory that holds no mpbroker store, a
    damaged or foreign file in the export directory, a manifest or schema version this code
    does not know, options that differ from the ones the export directory was made with, or
    an export directory another export holds; and during a run for an earlier file it reads
    that turns out missing or damaged.
    """

    def __init__(self, path: Path | str, detail: str) -> None:
        self.path = Path(path)
        """The file or directory concerned."""
        self.detail = detail
        """What is wrong with it."""
        super().__init__(f"export: {self.path}: {detail}")
