"""Errors of the persistent stores."""

from __future__ import annotations

from pathlib import Path

__all__ = ["StoreError"]


class StoreError(Exception):
    """A store operation failed; names the file, the operation and what went wrong.

    Raised for refused directories and segment files (foreign, newer schema) and for SQLite
    failures (disk full, I/O error). An `append()` or `settle()` that raises this changed
    nothing: its transaction was rolled back, so the caller can refuse the sends it covered.
    """

    def __init__(self, path: Path | str, operation: str, detail: str) -> None:
        self.path = Path(path)
        """The file (or store directory) concerned."""
        self.operation = operation
        """What the store was doing, e.g. ``append`` or ``open``."""
        self.detail = detail
        """Why it failed, e.g. the SQLite error text ``database or disk is full``."""
        super().__init__(f"{self.path}: {operation}: {detail}")
