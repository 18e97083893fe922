from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

from mpbroker.records import ACK_AUTO, ACK_CLIENT, Message, Record

# (gateway index, connection id, subscription handle): unique across the broker.
ConsumerKey = tuple[int, int, int]


class Outbox:
    """Records an engine wants sent, grouped by the gateway that must receive them."""

    __slots__ = ("by_gateway",)

    def __init__(self) -> None:
        self.by_gateway: dict[int, list[Record]] = {}

    def add(self, gateway: int, record: Record) -> None:
        batch = self.by_gateway.get(gateway)
        if batch is None:
            self.by_gateway[gateway] = [record]
        else:
            batch.append(record)

    def take(self) -> dict[int, list[Record]]:
        """Everything collected so far; the outbox is empty afterwards."""
        out, self.by_gateway = self.by_gateway, {}
        return out


@dataclass(eq=False)
class Consumer:
    """One subscription as a pipeline sees it.

    `unacked` holds deliveries still in its window, oldest first: for client modes the
    messages not yet acknowledged, for auto mode those the gateway has not yet reported
    as written to the socket (a `Credit`).
    """

    key: ConsumerKey
    sub_id: str
    destination: str
    ack_mode: int
    prefetch: int
    unacked: dict[str, Message] = field(default_factory=dict)
    # Topic subscribers only: messages waiting for room in the window.
    pending: deque[Message] = field(default_factory=deque)

    @property
    def ready(self) -> bool:
        return len(self.unacked) < self.prefetch

    def settle(self, message_id: str) -> list[Message]:
        """Remove what an ACK/NACK of `message_id` settles (cumulative in client mode).

        Unknown ids settle nothing: a stale id after a pipeline restart, or a duplicate ack.
        """
        if self.ack_mode == ACK_AUTO or message_id not in self.unacked:
            return []
        if self.ack_mode != ACK_CLIENT:
            return [self.unacked.pop(message_id)]
        settled: list[Message] = []
        for mid in list(self.unacked):
            settled.append(self.unacked.pop(mid))
            if mid == message_id:
                break
        return settled

    def credit(self, count: int) -> list[Message]:
        """Auto mode: the oldest `count` deliveries were written; returns those messages."""
        if self.ack_mode != ACK_AUTO:
            return []
        unacked = self.unacked
        if count >= len(unacked):
            done = list(unacked.values())
            unacked.clear()
            return done
        return [unacked.pop(key) for key in list(itertools.islice(unacked, count))]
