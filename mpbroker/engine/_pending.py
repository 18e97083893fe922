"""Messages waiting in a queue, highest JMS priority first, FIFO within a priority."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator

from mpbroker.records import Message

__all__ = ["HIGHEST_PRIORITY", "Pending"]

HIGHEST_PRIORITY = 9


class Pending:
    """An ordered map per JMS priority (0-9). `popleft` takes from the highest non-empty one.

    Messages that come back (NACK, a consumer gone) go to the head of their own priority,
    in their original order, so redelivery keeps FIFO within each priority. Any message can
    also leave from the middle in O(1) (`remove`): a queue with selectors keeps one Pending
    of every waiting message and one per selector of the messages it selects, and a
    message taken from one leaves the others.

    Entries are keyed by the message object itself (its `id()`, stable while the entry
    holds it), not by its message id: two waiting messages never shadow each other.
    """

    __slots__ = ("_count", "_levels")

    def __init__(self) -> None:
        self._levels = [OrderedDict[int, Message]() for _ in range(HIGHEST_PRIORITY + 1)]
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __iter__(self) -> Iterator[Message]:
        """In delivery order."""
        for level in reversed(self._levels):
            yield from level.values()

    def __contains__(self, message: object) -> bool:
        if not isinstance(message, Message):
            return False
        return self._levels[message.priority].get(id(message)) is message

    def append(self, message: Message) -> None:
        self._levels[message.priority][id(message)] = message
        self._count += 1

    def popleft(self) -> Message:
        for level in reversed(self._levels):
            if level:
                self._count -= 1
                return level.popitem(last=False)[1]
        raise IndexError("pop from empty Pending")

    def remove(self, message: Message) -> bool:
        """Take `message` out wherever it is; False when it is not here."""
        level = self._levels[message.priority]
        if level.pop(id(message), None) is None:
            return False
        self._count -= 1
        return True

    def extendleft(self, messages: Iterable[Message]) -> None:
        """Put `messages` (given in their original order) back at the head of their levels."""
        for message in reversed(list(messages)):
            level = self._levels[message.priority]
            key = id(message)
            level[key] = message
            level.move_to_end(key, last=False)
            self._count += 1

    def paging_candidates(self) -> Iterator[Message]:
        """Waiting non-persistent messages still in memory, the best to page out
        first: per priority (lowest first) the newest, after the last paged one; then those
        before the first paged one, newest first. Messages between two paged ones are not
        looked at, so a long paged backlog is not scanned again and again."""
        for level in self._levels:
            hit_paged = False
            for message in reversed(level.values()):
                if message.temp_key:
                    hit_paged = True
                    break
                if not message.persistent:
                    yield message
            if not hit_paged:
                continue
            head: list[Message] = []
            for message in level.values():
                if message.temp_key:
                    break
                if not message.persistent:
                    head.append(message)
            yield from reversed(head)

    def newest(self, priority: int) -> Message | None:
        level = self._levels[priority]
        return level[next(reversed(level))] if level else None

    def remove_where(self, doomed: set[str]) -> list[Message]:
        """Take out the messages whose ids are in `doomed` (e.g. expired); returns them."""
        removed: list[Message] = []
        for level in self._levels:
            for key, message in list(level.items()):
                if message.message_id in doomed:
                    del level[key]
                    removed.append(message)
        self._count -= len(removed)
        return removed
