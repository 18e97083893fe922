"""The storage module's small processing buffer: when to group-commit (pure, no I/O, no clock).

docs/architecture.md, "The life of a message", step 4: persistent messages are flushed into one store transaction
at the first of `max_delay_ms`, `max_messages` and `max_bytes`. The caller owns the clock and
the store; this class only answers "flush now?" and "flush when?".
"""

from __future__ import annotations

from typing import Generic, TypeVar

from mpbroker.config import StoreSettings

__all__ = ["CommitBuffer"]

T = TypeVar("T")


class CommitBuffer(Generic[T]):
    """Items waiting for one group commit, in arrival order.

    `max_messages=1` switches group commit off: every `add()` asks for a flush at once.
    An item larger than `max_bytes` is still accepted and flushed alone (or with what came
    before it), so a big message can never be stuck.
    """

    __slots__ = ("_bytes", "_first_ms", "_items", "max_bytes", "max_delay_ms", "max_messages")

    @classmethod
    def for_settings(cls, settings: StoreSettings) -> CommitBuffer[T]:
        """The buffer `[store]` describes (`group_commit = false`: one commit per message)."""
        return cls(
            settings.commit_max_delay_ms,
            settings.commit_max_messages if settings.group_commit else 1,
            settings.commit_max_bytes,
        )

    def __init__(self, max_delay_ms: int, max_messages: int, max_bytes: int) -> None:
        if max_delay_ms < 0:
            raise ValueError(f"max_delay_ms = {max_delay_ms}: must be >= 0")
        if max_messages < 1:
            raise ValueError(f"max_messages = {max_messages}: must be >= 1")
        if max_bytes < 1:
            raise ValueError(f"max_bytes = {max_bytes}: must be >= 1")
        self.max_delay_ms = max_delay_ms
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._items: list[T] = []
        self._bytes = 0
        self._first_ms = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def bytes(self) -> int:
        """Sum of the sizes of the buffered items."""
        return self._bytes

    def add(self, item: T, size: int, now_ms: int) -> bool:
        """Buffer `item`; True when the buffer must be flushed now (count or bytes reached).

        The delay deadline is not checked here: ask `due_in_ms()`.
        """
        if not self._items:
            self._first_ms = now_ms
        self._items.append(item)
        self._bytes += size
        return len(self._items) >= self.max_messages or self._bytes >= self.max_bytes

    def due_in_ms(self, now_ms: int) -> int | None:
        """Milliseconds until the oldest item's delay runs out (0: flush now); None if empty."""
        if not self._items:
            return None
        return max(0, self._first_ms + self.max_delay_ms - now_ms)

    def take(self) -> list[T]:
        """Everything buffered, in arrival order; the buffer is empty afterwards."""
        items = self._items
        self._items = []
        self._bytes = 0
        return items
