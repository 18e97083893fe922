"""Publish/subscribe engine: non-persistent topics and their subscribers."""

from __future__ import annotations

import msgspec

from mpbroker.config import TopicSettings
from mpbroker.records import Deliver, Message, Refuse, Send

from ._common import Consumer, Engine, Outbox


class TopicEngine(Engine):
    """Owns the topics of one pubsub partition: every subscriber gets every message.

    A subscriber whose window is full keeps later messages in its own backlog, in order,
    up to `max_pending_messages`; a publish that would overflow a backlog is refused with
    an ERROR naming the limit rather than dropped (flow control replaces the refusal with
    blocking later). One producer's messages reach every subscriber in the order sent.
    """

    role = "pubsub"

    def __init__(self, settings: TopicSettings, pipeline: int, outbox: Outbox) -> None:
        super().__init__(pipeline, outbox)
        self.settings = settings
        self.topics: dict[str, list[Consumer]] = {}

    def _send(self, gateway: int, record: Send) -> None:
        message = record.message
        subscribers = self.topics.get(message.destination, ())
        limit = self.settings.max_pending_messages
        for consumer in subscribers:
            if len(consumer.pending) >= limit:
                self.outbox.add(
                    gateway,
                    Refuse(
                        record.conn,
                        f"ResourceAllocation: {message.destination} max_pending_messages "
                        f"{limit} reached",
                        f"Subscription {consumer.sub_id!r} has {limit} undelivered messages; "
                        "the message was not published to anyone.",
                        record.receipt,
                    ),
                )
                return
        self.received += 1
        # One Deliver per gateway carries every target there, so a fan-out to many
        # subscribers on one gateway costs one ring record.
        targets: dict[int, list[tuple[int, int]]] = {}
        for consumer in subscribers:
            if consumer.pending or len(consumer.unacked) >= consumer.prefetch:
                consumer.pending.append(message)
                continue
            consumer.unacked[message.message_id] = message
            gateway_index, conn, sub = consumer.key
            batch = targets.get(gateway_index)
            if batch is None:
                targets[gateway_index] = [(conn, sub)]
            else:
                batch.append((conn, sub))
        for gateway_index, batch in targets.items():
            self.outbox.add(gateway_index, Deliver(batch, message))
            self.delivered += len(batch)
        self._receipt(gateway, record.conn, record.receipt)

    def _settled(self, consumer: Consumer, messages: list[Message], *, nack: bool) -> None:
        if nack:
            # A non-durable subscriber gets a NACKed message again, before newer ones.
            consumer.pending.extendleft(
                msgspec.structs.replace(m, redelivered=True) for m in reversed(messages)
            )
        self._drain(consumer)

    def _added(self, consumer: Consumer) -> None:
        self.topics.setdefault(consumer.destination, []).append(consumer)

    def _drain(self, consumer: Consumer) -> None:
        """Move backlog into the window while it has room."""
        gateway, conn, sub = consumer.key
        while consumer.pending and len(consumer.unacked) < consumer.prefetch:
            message = consumer.pending.popleft()
            consumer.unacked[message.message_id] = message
            self.outbox.add(gateway, Deliver([(conn, sub)], message))
            self.delivered += 1

    def _removed(self, consumers: list[Consumer], *, requeue_auto: bool) -> None:
        # A non-durable subscription's backlog and window go with it.
        for consumer in consumers:
            subscribers = self.topics[consumer.destination]
            subscribers.remove(consumer)
            if not subscribers:
                del self.topics[consumer.destination]
