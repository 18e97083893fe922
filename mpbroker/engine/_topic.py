"""Publish/subscribe engine: non-persistent topics and their subscribers."""

from __future__ import annotations

import msgspec

from mpbroker.config import TopicSettings
from mpbroker.records import (
    Ack,
    Barrier,
    BarrierDone,
    ConnClosed,
    Credit,
    Deliver,
    Hello,
    Nack,
    Receipt,
    Record,
    Refuse,
    Send,
    Subscribe,
    Unsubscribe,
)

from ._common import Consumer, ConsumerKey, Outbox


class TopicEngine:
    """Owns the topics of one pubsub partition: every subscriber gets every message.

    A subscriber whose window is full keeps later messages in its own backlog, in order,
    up to `max_pending_messages`; a publish that would overflow a backlog is refused with
    an ERROR naming the limit rather than dropped (flow control replaces the refusal with
    blocking later). One producer's messages reach every subscriber in the order sent.
    """

    def __init__(self, settings: TopicSettings, pipeline: int, outbox: Outbox) -> None:
        self.settings = settings
        self.pipeline = pipeline
        self.outbox = outbox
        self.topics: dict[str, list[Consumer]] = {}
        self.consumers: dict[ConsumerKey, Consumer] = {}
        self.delivered = 0
        self.received = 0

    def handle(self, gateway: int, record: Record) -> None:
        match record:
            case Send():
                self._publish(gateway, record)
            case Ack():
                self._settle(gateway, record.conn, record.sub, record.message_id, nack=False)
                self._receipt(gateway, record.conn, record.receipt)
            case Nack():
                self._settle(gateway, record.conn, record.sub, record.message_id, nack=True)
                self._receipt(gateway, record.conn, record.receipt)
            case Credit():
                for sub, count in record.subs:
                    consumer = self.consumers.get((gateway, record.conn, sub))
                    if consumer is not None and consumer.credit(count):
                        self._drain(consumer)
            case Subscribe():
                key = (gateway, record.conn, record.sub)
                if key not in self.consumers:
                    consumer = Consumer(
                        key, record.sub_id, record.destination, record.ack_mode, record.prefetch
                    )
                    self.consumers[key] = consumer
                    self.topics.setdefault(record.destination, []).append(consumer)
                self._receipt(gateway, record.conn, record.receipt)
            case Unsubscribe():
                self._remove((gateway, record.conn, record.sub))
                self._receipt(gateway, record.conn, record.receipt)
            case ConnClosed():
                for key in [k for k in self.consumers if k[0] == gateway and k[1] == record.conn]:
                    self._remove(key)
            case Hello():
                for key in [k for k in self.consumers if k[0] == gateway]:
                    self._remove(key)
            case Barrier():
                self.outbox.add(gateway, BarrierDone(record.conn, record.token, self.pipeline))
            case _:
                raise ValueError(f"pubsub pipeline cannot handle {type(record).__name__}")

    def _publish(self, gateway: int, record: Send) -> None:
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

    def _settle(self, gateway: int, conn: int, sub: int, message_id: str, *, nack: bool) -> None:
        consumer = self.consumers.get((gateway, conn, sub))
        if consumer is None:
            return
        settled = consumer.settle(message_id)
        if nack and settled:
            # A non-durable subscriber gets a NACKed message again, before newer ones.
            consumer.pending.extendleft(
                msgspec.structs.replace(m, redelivered=True) for m in reversed(settled)
            )
        if settled:
            self._drain(consumer)

    def _drain(self, consumer: Consumer) -> None:
        """Move backlog into the window while it has room."""
        gateway, conn, sub = consumer.key
        while consumer.pending and len(consumer.unacked) < consumer.prefetch:
            message = consumer.pending.popleft()
            consumer.unacked[message.message_id] = message
            self.outbox.add(gateway, Deliver([(conn, sub)], message))
            self.delivered += 1

    def _remove(self, key: ConsumerKey) -> None:
        consumer = self.consumers.pop(key, None)
        if consumer is None:
            return
        subscribers = self.topics[consumer.destination]
        subscribers.remove(consumer)
        if not subscribers:
            del self.topics[consumer.destination]

    def _receipt(self, gateway: int, conn: int, receipt: str) -> None:
        if receipt:
            self.outbox.add(gateway, Receipt(conn, receipt))
