"""Messages waiting in a queue, highest JMS priority first, FIFO within a priority."""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator

from mpbroker.records import Message

__all__ = ["HIGHEST_PRIORITY", "IndexedPending", "Pending"]

HIGHEST_PRIORITY = 9


class Pending:
    """A deque per JMS priority (0-9). `popleft` takes from the highest non-empty one.

    Messages that come back (NACK, a consumer gone) go to the head of their own priority,
    in their original order, so redelivery keeps FIFO within each priority. `remove` from
    the middle is O(n) here: a queue whose consumers have selectors switches to
    `IndexedPending` (O(1), but ~130 B more per message and slower) when its first selector
    arrives; every other queue keeps this lean form.

    A level's deque is made when its first message comes (an empty deque costs 760 B, so
    ten of them were most of an idle queue's memory: docs/flow-control-and-memory.md,
    "What a destination costs"); most queues only ever use the default priority.
    """

    __slots__ = ("_count", "_levels")

    def __init__(self) -> None:
        self._levels: list[deque[Message] | None] = [None] * (HIGHEST_PRIORITY + 1)
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __iter__(self) -> Iterator[Message]:
        """In delivery order."""
        for level in reversed(self._levels):
            if level is not None:
                yield from level

    def append(self, message: Message) -> None:
        level = self._levels[message.priority]
        if level is None:
            level = self._levels[message.priority] = deque()
        level.append(message)
        self._count += 1

    def popleft(self) -> Message:
        for level in reversed(self._levels):
            if level:
                self._count -= 1
                return level.popleft()
        raise IndexError("pop from empty Pending")

    def remove(self, message: Message) -> bool:
        """Take `message` (this very object) out wherever it is; False when it is not here."""
        level = self._levels[message.priority]
        if level is None:
            return False
        for i, waiting in enumerate(level):
            if waiting is message:
                del level[i]
                self._count -= 1
                return True
        return False

    def extendleft(self, messages: Iterable[Message]) -> None:
        """Put `messages` (given in their original order) back at the head of their levels."""
        for message in reversed(list(messages)):
            level = self._levels[message.priority]
            if level is None:
                level = self._levels[message.priority] = deque()
            level.appendleft(message)
            self._count += 1

    def paging_candidates(self) -> Iterator[Message]:
        """Waiting non-persistent messages still in memory, the best to page out
        first: per priority (lowest first) the newest, after the last paged one; then those
        before the first paged one, newest first. Messages between two paged ones are not
        looked at, so a long paged backlog is not scanned again and again."""
        for level in self._levels:
            if level:
                yield from _paging_candidates(level, reversed(level))

    def newest(self, priority: int) -> Message | None:
        level = self._levels[priority]
        return level[-1] if level else None

    def remove_where(self, doomed: set[str]) -> list[Message]:
        """Take out the messages whose ids are in `doomed` (e.g. expired); returns them."""
        removed: list[Message] = []
        for i, level in enumerate(self._levels):
            if level and any(m.message_id in doomed for m in level):
                keep = deque(m for m in level if m.message_id not in doomed)
                removed.extend(m for m in level if m.message_id in doomed)
                self._levels[i] = keep
        self._count -= len(removed)
        return removed


class IndexedPending(Pending):
    """A Pending whose messages also leave from the middle in O(1) (`remove`): an ordered
    map per priority, keyed by the message object itself (its `id()`, stable while the
    entry holds it; never by message id, so two waiting messages never shadow each other).

    A queue with selector consumers keeps every waiting message in one, and one per
    selector with the messages it selects: a message taken from one leaves the others.
    """

    __slots__ = ("_indexed",)

    def __init__(self, messages: Iterable[Message] = ()) -> None:
        """`messages`: in delivery order (another Pending's, when a queue switches)."""
        # (Pending's deques are not made: every method that reads them is overridden.)
        self._count = 0
        self._indexed = [OrderedDict[int, Message]() for _ in range(HIGHEST_PRIORITY + 1)]
        for message in messages:
            self.append(message)

    def __iter__(self) -> Iterator[Message]:
        for level in reversed(self._indexed):
            yield from level.values()

    def append(self, message: Message) -> None:
        self._indexed[message.priority][id(message)] = message
        self._count += 1

    def popleft(self) -> Message:
        for level in reversed(self._indexed):
            if level:
                self._count -= 1
                return level.popitem(last=False)[1]
        raise IndexError("pop from empty Pending")

    def remove(self, message: Message) -> bool:
        level = self._indexed[message.priority]
        if level.pop(id(message), None) is None:
            return False
        self._count -= 1
        return True

    def extendleft(self, messages: Iterable[Message]) -> None:
        for message in reversed(list(messages)):
            level = self._indexed[message.priority]
            key = id(message)
            level[key] = message
            level.move_to_end(key, last=False)
            self._count += 1

    def paging_candidates(self) -> Iterator[Message]:
        for level in self._indexed:
            yield from _paging_candidates(level.values(), reversed(level.values()))

    def newest(self, priority: int) -> Message | None:
        level = self._indexed[priority]
        return level[next(reversed(level))] if level else None

    def remove_where(self, doomed: set[str]) -> list[Message]:
        removed: list[Message] = []
        for level in self._indexed:
            for key, message in list(level.items()):
                if message.message_id in doomed:
                    del level[key]
                    removed.append(message)
        self._count -= len(removed)
        return removed


def _paging_candidates(
    oldest_first: Iterable[Message], newest_first: Iterable[Message]
) -> Iterator[Message]:
    """One priority level's part of `Pending.paging_candidates`."""
    hit_paged = False
    for message in newest_first:
        if message.temp_key:
            hit_paged = True
            break
        if not message.persistent:
            yield message
    if not hit_paged:
        return
    head: list[Message] = []
    for message in oldest_first:
        if message.temp_key:
            break
        if not message.persistent:
            head.append(message)
    yield from reversed(head)
