"""The durable topic subscriptions of one pubsub partition, in a small SQLite file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import sqlite_utils

from mpbroker.clock import epoch_ms

from ._errors import StoreError

__all__ = ["DurableRegistry"]


class DurableRegistry:
    """Durable subscription name -> topic; survives restarts, even with an empty backlog."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(path, isolation_level=None)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=FULL")
            db = sqlite_utils.Database(self._conn)
            db.table("subscriptions").create(
                {"name": str, "destination": str, "created_ms": int}, pk="name", if_not_exists=True
            )
        except sqlite3.Error as exc:
            raise StoreError(path, "open", str(exc)) from None

    def load(self) -> dict[str, str]:
        rows = self._conn.execute("SELECT name, destination FROM subscriptions")
        return {name: destination for name, destination in rows}

    def put(self, name: str, destination: str) -> None:
        try:
            self._conn.execute(
                "INSERT OR REPLACE INTO subscriptions (name, destination, created_ms) "
                "VALUES (?, ?, ?)",
                (name, destination, epoch_ms()),
            )
        except sqlite3.Error as exc:
            raise StoreError(self.path, "subscribe", str(exc)) from None

    def remove(self, name: str) -> None:
        try:
            self._conn.execute("DELETE FROM subscriptions WHERE name = ?", (name,))
        except sqlite3.Error as exc:
            raise StoreError(self.path, "unsubscribe", str(exc)) from None

    def close(self) -> None:
        self._conn.close()
