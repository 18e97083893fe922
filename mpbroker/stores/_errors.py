"""Errors of the persistent stores."""

from __future__ import annotations

from pathlib import Path

from ._reserve import is_disk_full

__all__ = ["DiskLimitReached", "StoreError", "sqlite_detail"]


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

    @property
    def disk_full(self) -> bool:
        """Whether the failure may come from a full filesystem (the SQLite or OS error it
        was raised from says so)."""
        return is_disk_full(self.__cause__)

    @property
    def client_text(self) -> str:
        """What a client is told: the operation and the reason, never the server's paths."""
        return f"store error: {self.operation}: {self.detail}"


class DiskLimitReached(StoreError):
    """An append refused before anything was written: the most it could take (its roll
    and checkpoint included) would bring its filesystem below
    `store.disk_free_limit_bytes`, with what the other stores may be writing meanwhile."""

    def __init__(self, path: Path | str, limit: int, free: int, need: int) -> None:
        super().__init__(
            path,
            "append",
            f"{free} bytes free, and this append with what the other stores may write "
            f"meanwhile could take {need}: below disk_free_limit {limit}",
        )
        self.limit = limit
        """The limit in bytes."""
        self.free = free
        """The free space read before the append."""
        self.need = need
        """The most the append, and the other stores meanwhile, could take."""


def sqlite_detail(exc: BaseException) -> str:
    """An SQLite error's text with its error name when the driver gives one
    (``database or disk is full (SQLITE_FULL)``): the name is what to search for."""
    name = getattr(exc, "sqlite_errorname", None)
    return f"{exc} ({name})" if name else str(exc)
