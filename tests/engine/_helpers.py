"""Shortcuts for driving the pipeline engines with records and reading their outbox."""

from __future__ import annotations

from functools import partial
from typing import TypeVar

from mpbroker.records import Deliver, Message, Record, Send
from tests import factories

T = TypeVar("T")

#: Messages sized as the owning pipeline sizes them on arrival, so delivered copies compare equal.
make_message = partial(factories.make_message, sized=True)


def send(
    conn: int,
    message_id: str,
    destination: str = "/queue/q",
    body: bytes = b"body",
    receipt: str = "",
) -> Send:
    return Send(conn, make_message(message_id, destination, body=body), receipt)


Delivery = tuple[int, int, int, str]  # (gateway, conn, sub, message id)


def deliveries(out: dict[int, list[Record]]) -> list[Delivery]:
    """Every delivery in an outbox batch, one entry per target, in order per gateway."""
    found: list[Delivery] = []
    for gateway, batch in sorted(out.items()):
        for record in batch:
            if isinstance(record, Deliver):
                for conn, sub in record.targets:
                    found.append((gateway, conn, sub, record.message.message_id))
    return found


def delivered_messages(out: dict[int, list[Record]]) -> list[Message]:
    """The message of every Deliver record, in order per gateway."""
    return [
        record.message
        for _, batch in sorted(out.items())
        for record in batch
        if isinstance(record, Deliver)
    ]


def of_type(out: dict[int, list[Record]], kind: type[T]) -> list[tuple[int, T]]:
    """(gateway, record) for every record of one type in an outbox batch."""
    return [
        (gateway, record)
        for gateway, batch in sorted(out.items())
        for record in batch
        if isinstance(record, kind)
    ]


class FakePager:
    """A temp store in a dict, with room for `room` pages."""

    def __init__(self, room: int = 100) -> None:
        self.bodies: dict[int, bytes] = {}
        self.room = room
        self.next_key = 1
        self.writes = 0

    def put(self, page: bytes) -> int | None:
        if len(self.bodies) >= self.room:
            return None
        key, self.next_key = self.next_key, self.next_key + 1
        self.bodies[key] = page
        self.writes += 1
        return key

    def read(self, key: int) -> bytes:
        return self.bodies[key]

    def take(self, key: int) -> bytes:
        return self.bodies.pop(key)

    def drop(self, key: int) -> None:
        del self.bodies[key]
