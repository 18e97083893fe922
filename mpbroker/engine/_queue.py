"""Point-to-point engine: non-persistent queues (the VolQueueStore) and their consumers."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import msgspec

from mpbroker.config import QueueSettings
from mpbroker.records import (
    ACK_AUTO,
    Ack,
    Barrier,
    BarrierDone,
    ConnClosed,
    Credit,
    Deliver,
    Hello,
    Message,
    Nack,
    Receipt,
    Record,
    Refuse,
    Send,
    Subscribe,
    Unsubscribe,
    message_size,
)

from ._common import Consumer, ConsumerKey, Outbox


@dataclass(eq=False)
class _Queue:
    name: str
    pending: deque[Message] = field(default_factory=deque)
    consumers: list[Consumer] = field(default_factory=list)
    next_consumer: int = 0
    # Messages held: pending plus delivered-but-unsettled.
    held_messages: int = 0


def _redelivery(message: Message) -> Message:
    return msgspec.structs.replace(message, redelivered=True)


class QueueEngine:
    """Owns the queues of one p2p partition: each message goes to exactly one consumer.

    Ready consumers (window not full) are served round robin. NACK, and a consumer that
    goes away with unsettled messages, put those messages back at the head of the queue
    with `redelivered` set, in their original order.
    """

    def __init__(self, settings: QueueSettings, pipeline: int, outbox: Outbox) -> None:
        self.settings = settings
        self.pipeline = pipeline
        self.outbox = outbox
        self.queues: dict[str, _Queue] = {}
        self.consumers: dict[ConsumerKey, Consumer] = {}
        self.held_bytes = 0
        self.delivered = 0
        self.received = 0

    # -- entry point ---------------------------------------------------------------------

    def handle(self, gateway: int, record: Record) -> None:
        match record:
            case Send():
                self._send(gateway, record)
            case Ack():
                self._settle(gateway, record.conn, record.sub, record.message_id, requeue=False)
                self._receipt(gateway, record.conn, record.receipt)
            case Nack():
                self._settle(gateway, record.conn, record.sub, record.message_id, requeue=True)
                self._receipt(gateway, record.conn, record.receipt)
            case Credit():
                for sub, count in record.subs:
                    consumer = self.consumers.get((gateway, record.conn, sub))
                    if consumer is not None:
                        written = consumer.credit(count)
                        if written:
                            self._release(consumer, written)
            case Subscribe():
                self._subscribe(gateway, record)
            case Unsubscribe():
                self._remove_consumers([(gateway, record.conn, record.sub)], requeue_auto=True)
                self._receipt(gateway, record.conn, record.receipt)
            case ConnClosed():
                keys = [k for k in self.consumers if k[0] == gateway and k[1] == record.conn]
                self._remove_consumers(keys, requeue_auto=True)
            case Hello():
                # The gateway died: auto-mode deliveries it held may have reached a client,
                # so only client-mode unsettled messages come back (at most once).
                keys = [k for k in self.consumers if k[0] == gateway]
                self._remove_consumers(keys, requeue_auto=False)
            case Barrier():
                self.outbox.add(gateway, BarrierDone(record.conn, record.token, self.pipeline))
            case _:
                raise ValueError(f"p2p pipeline cannot handle {type(record).__name__}")

    # -- producers -----------------------------------------------------------------------

    def _send(self, gateway: int, record: Send) -> None:
        message = record.message
        queue = self.queues.get(message.destination)
        size = message.size = message_size(message)
        limit = self._refusal(queue.held_messages if queue else 0, size)
        if limit:
            self.outbox.add(
                gateway,
                Refuse(
                    record.conn,
                    f"ResourceAllocation: {message.destination} {limit} reached",
                    "The message was not accepted. Consume from the queue, or raise the "
                    "limit in the broker's [queues] configuration.",
                    record.receipt,
                ),
            )
            return
        self.received += 1
        if queue is None:
            queue = self.queues[message.destination] = _Queue(message.destination)
        queue.pending.append(message)
        queue.held_messages += 1
        self.held_bytes += size
        self._receipt(gateway, record.conn, record.receipt)
        self._dispatch(queue)

    def _refusal(self, held_messages: int, size: int) -> str:
        """The limit a new message of `size` bytes would break, or '' if it fits."""
        if held_messages >= self.settings.max_messages:
            return f"max_messages {self.settings.max_messages}"
        if self.held_bytes + size > self.settings.max_bytes:
            return f"max_bytes {self.settings.max_bytes}"
        return ""

    # -- consumers -----------------------------------------------------------------------

    def _subscribe(self, gateway: int, record: Subscribe) -> None:
        key = (gateway, record.conn, record.sub)
        # Re-registration after a pipeline restart may repeat a Subscribe still in the
        # ring: keep the consumer we have.
        if key not in self.consumers:
            consumer = Consumer(
                key, record.sub_id, record.destination, record.ack_mode, record.prefetch
            )
            self.consumers[key] = consumer
            queue = self.queues.get(record.destination)
            if queue is None:
                queue = self.queues[record.destination] = _Queue(record.destination)
            queue.consumers.append(consumer)
            self._dispatch(queue)
        self._receipt(gateway, record.conn, record.receipt)

    def _remove_consumers(self, keys: list[ConsumerKey], *, requeue_auto: bool) -> None:
        """Remove consumers, then put their unsettled messages back, then dispatch.

        All are removed before anything is dispatched, so that messages requeued from one
        of them can never be handed to another that is going away too.
        """
        removed = [c for c in (self.consumers.pop(key, None) for key in keys) if c is not None]
        touched: dict[str, _Queue] = {}
        for consumer in removed:
            queue = self.queues[consumer.destination]
            queue.consumers.remove(consumer)
            touched[queue.name] = queue
        for consumer in removed:
            queue = touched[consumer.destination]
            unsettled = list(consumer.unacked.values())
            consumer.unacked.clear()
            if consumer.ack_mode == ACK_AUTO and not requeue_auto:
                self._forget(queue, unsettled)
                continue
            queue.pending.extendleft(_redelivery(m) for m in reversed(unsettled))
        for queue in touched.values():
            self._dispatch(queue)
            self._drop_if_idle(queue)

    def _settle(self, gateway: int, conn: int, sub: int, message_id: str, *, requeue: bool) -> None:
        consumer = self.consumers.get((gateway, conn, sub))
        if consumer is None:
            return
        settled = consumer.settle(message_id)
        if not settled:
            return
        queue = self.queues[consumer.destination]
        if requeue:
            queue.pending.extendleft(_redelivery(m) for m in reversed(settled))
            self._dispatch(queue)
        else:
            self._release(consumer, settled)

    def _release(self, consumer: Consumer, settled: list[Message]) -> None:
        """Settled messages leave the store; the consumer's window has room again."""
        queue = self.queues[consumer.destination]
        self._forget(queue, settled)
        self._dispatch(queue)

    def _forget(self, queue: _Queue, messages: list[Message]) -> None:
        queue.held_messages -= len(messages)
        self.held_bytes -= sum(m.size for m in messages)

    def _dispatch(self, queue: _Queue) -> None:
        """Hand pending messages to ready consumers, round robin."""
        consumers = queue.consumers
        count = len(consumers)
        if not count:
            return
        pending = queue.pending
        misses = 0
        index = queue.next_consumer
        while pending and misses < count:
            consumer = consumers[index % count]
            index += 1
            if len(consumer.unacked) >= consumer.prefetch:
                misses += 1
                continue
            misses = 0
            message = pending.popleft()
            consumer.unacked[message.message_id] = message
            gateway, conn, sub = consumer.key
            self.outbox.add(gateway, Deliver([(conn, sub)], message))
            self.delivered += 1
        queue.next_consumer = index % count

    def _drop_if_idle(self, queue: _Queue) -> None:
        # Queues are created on first use; forget empty ones so names don't accumulate.
        if not queue.consumers and not queue.pending and not queue.held_messages:
            del self.queues[queue.name]

    def _receipt(self, gateway: int, conn: int, receipt: str) -> None:
        if receipt:
            self.outbox.add(gateway, Receipt(conn, receipt))

    # -- introspection -------------------------------------------------------------------

    def depth(self, destination: str) -> int:
        """Messages waiting in a queue for a consumer (not counting unacknowledged ones)."""
        queue = self.queues.get(destination)
        return len(queue.pending) if queue else 0
