"""Which durable subscription a replay worker reads for next, and how much. Pure logic.

The replay budget (docs/architecture.md, "Durable replay"): at most `max_concurrent` subscriptions replay at
once, each holding a place from its first request until it is released (caught up, or
gone); the others wait in arrival order. A batch is at most `batch_messages` messages and
`batch_bytes` bytes, and all batches in flight together at most `global_bytes`. A batch is
in flight from the moment it is read until its subscription asks for the next one (its
owner took it into memory and delivered most of it) or is released. A single message
larger than the whole budget is still replayed, alone, once nothing else is in flight.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from mpbroker.records import ReplayRequest

__all__ = ["Grant", "ReplayKey", "ReplayScheduler"]

# (pubsub partition, durable subscription name)
ReplayKey = tuple[int, str]


@dataclass(frozen=True, slots=True)
class Grant:
    """Permission to read one batch for `request`."""

    request: ReplayRequest
    max_messages: int
    max_bytes: int
    # True when nothing else is in flight: the first message goes even if it is larger
    # than max_bytes (otherwise it could never be replayed).
    at_least_one: bool

    @property
    def key(self) -> ReplayKey:
        return (self.request.partition, self.request.name)


class ReplayScheduler:
    def __init__(
        self, max_concurrent: int, global_bytes: int, batch_messages: int, batch_bytes: int
    ) -> None:
        self.max_concurrent = max_concurrent
        self.global_bytes = global_bytes
        self.batch_messages = batch_messages
        self.batch_bytes = batch_bytes
        self.places: list[ReplayKey] = []  # replaying now, in the order they got a place
        self.waiting: deque[ReplayKey] = deque()  # want to replay, no place yet
        self.requests: dict[ReplayKey, ReplayRequest] = {}  # not served yet
        self.in_flight: dict[ReplayKey, int] = {}  # bytes of the last batch sent
        self.in_flight_bytes = 0
        # A key whose next message did not fit waits until in-flight bytes drop below this.
        self.stalled: dict[ReplayKey, int] = {}
        self.turn = 0  # round robin over places

    def request(self, request: ReplayRequest) -> None:
        """The owner wants the next batch (it took the previous one, if any)."""
        key = (request.partition, request.name)
        self._land(key)
        self.requests[key] = request  # a newer request replaces an older one
        if key not in self.places and key not in self.waiting:
            self.waiting.append(key)

    def release(self, partition: int, name: str = "") -> None:
        """A subscription stopped replaying; an empty name: all of that partition's."""
        keys = {k for k in (*self.places, *self.waiting, *self.requests, *self.in_flight)}
        for key in keys:
            if key[0] == partition and (not name or key[1] == name):
                self._land(key)
                self.requests.pop(key, None)
                self.stalled.pop(key, None)
                if key in self.places:
                    self.places.remove(key)
                if key in self.waiting:
                    self.waiting.remove(key)

    def next_grant(self) -> Grant | None:
        """The next batch to read, or None while nothing may proceed."""
        while self.waiting and len(self.places) < self.max_concurrent:
            self.places.append(self.waiting.popleft())
        room = self.global_bytes - self.in_flight_bytes
        if room <= 0 and self.in_flight_bytes:
            return None
        count = len(self.places)
        for step in range(count):
            key = self.places[(self.turn + step) % count]
            request = self.requests.get(key)
            if request is None:
                continue
            stalled_at = self.stalled.get(key)
            if stalled_at is not None and self.in_flight_bytes >= stalled_at:
                continue
            self.turn = (self.turn + step + 1) % count
            return Grant(
                request,
                self.batch_messages,
                max(0, min(self.batch_bytes, room)),
                at_least_one=self.in_flight_bytes == 0,
            )
        return None

    def sent(self, grant: Grant, size: int, *, fitted: bool) -> None:
        """The batch for `grant` was read: `size` bytes went to the owner. `fitted` is
        False when its first message did not fit the bytes granted (nothing was sent):
        it waits until some bytes in flight come back."""
        key = grant.key
        if not fitted:
            self.stalled[key] = self.in_flight_bytes
            return
        self.stalled.pop(key, None)
        del self.requests[key]
        self.in_flight[key] = size
        self.in_flight_bytes += size

    def _land(self, key: ReplayKey) -> None:
        size = self.in_flight.pop(key, 0)
        self.in_flight_bytes -= size

    @property
    def busy(self) -> bool:
        """Requests are waiting to be served."""
        return bool(self.requests)
