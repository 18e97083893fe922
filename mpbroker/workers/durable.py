"""Durable topic subscriptions in a pubsub worker.

A durable subscription is kept as a queue of its own, as Artemis does: every persistent
message published to its topic is stored in that queue (through the same group-commit
store path as persistent queue messages) whether or not its subscriber is connected, and
the subscriber consumes that queue. Coming back, it first gets what waited for it, then new
messages, in publish order, with nothing lost or duplicated at the seam (it is one queue).
Waiting messages beyond the index cache keep only their index entry in memory.
"""

from __future__ import annotations

import logging

import msgspec

from mpbroker.engine import ConsumerKey, Outbox, QueueEngine, TopicEngine
from mpbroker.records import (
    Ack,
    ConnClosed,
    Credit,
    Hello,
    Nack,
    Record,
    Refuse,
    Send,
    Subscribe,
    Unsubscribe,
)
from mpbroker.stores import DurableRegistry

from .persistence import QueuePersistence

__all__ = ["Durables", "durable_queue"]

log = logging.getLogger("mpbroker.pipeline")


def durable_queue(name: str) -> str:
    """The internal queue that holds a durable subscription's messages."""
    return f"durable:{name}"


class Durables:
    def __init__(
        self,
        registry: DurableRegistry,
        topics: TopicEngine,
        queues: QueueEngine,
        persistence: QueuePersistence,
        outbox: Outbox,
    ) -> None:
        self.registry = registry
        self.topics = topics
        self.queues = queues
        self.persistence = persistence
        self.outbox = outbox
        self.destination_of = registry.load()
        self.by_topic: dict[str, set[str]] = {}
        for name, topic in self.destination_of.items():
            self.by_topic.setdefault(topic, set()).add(name)
        # Durable name -> the consumer holding it now (at most one at a time, as in JMS).
        self.active: dict[str, ConsumerKey] = {}

    def handle(self, gateway: int, record: Record) -> None:
        """Route a record to the durable-subscription queues or the live topic engine."""
        match record:
            case Send():
                self._publish(gateway, record)
            case Subscribe(durable=name) if name:
                self._subscribe(gateway, record, name)
            case Ack() | Nack() | Unsubscribe():
                key = (gateway, record.conn, record.sub)
                if key in self.queues.consumers:
                    self.queues.handle(gateway, record)
                    if isinstance(record, Unsubscribe):
                        self._unsubscribed(key, remove=record.remove_durable)
                else:
                    self.topics.handle(gateway, record)
            case Credit() | ConnClosed() | Hello():
                # Both engines ignore the consumers they do not have.
                self.topics.handle(gateway, record)
                self.queues.handle(gateway, record)
            case _:
                self.topics.handle(gateway, record)

    def _publish(self, gateway: int, record: Send) -> None:
        message = record.message
        names = sorted(self.by_topic.get(message.destination, ()))
        # Non-persistent messages only reach durable subscribers that are connected.
        names = [n for n in names if message.persistent or self._is_active(n)]
        if not names:
            self.topics.handle(gateway, record)
            return
        self.topics.handle(gateway, msgspec.structs.replace(record, receipt=""))
        for i, name in enumerate(names):
            copy = msgspec.structs.replace(message, destination=durable_queue(name))
            # The receipt rides on the last copy: stored copies are committed in order,
            # so it is answered once every copy is stored.
            receipt = record.receipt if i == len(names) - 1 else ""
            send = Send(record.conn, copy, receipt)
            if copy.persistent:
                self.persistence.offer(gateway, send)
            else:
                self.queues.handle(gateway, send)

    def _subscribe(self, gateway: int, record: Subscribe, name: str) -> None:
        key = (gateway, record.conn, record.sub)
        holder = self.active.get(name)
        if holder is not None and holder != key and holder in self.queues.consumers:
            self.outbox.add(
                gateway,
                Refuse(
                    record.conn,
                    f"durable subscription {name!r} is already active",
                    "A durable subscription has one subscriber at a time.",
                    record.receipt,
                ),
            )
            return
        topic = self.destination_of.get(name)
        if topic != record.destination:
            if topic is not None:
                # Subscribing under the same name to another topic replaces the old one.
                self._remove(name)
            self.registry.put(name, record.destination)
            self.destination_of[name] = record.destination
            self.by_topic.setdefault(record.destination, set()).add(name)
            log.info("durable subscription %r on %s created", name, record.destination)
        self.active[name] = key
        self.queues.handle(
            gateway, msgspec.structs.replace(record, destination=durable_queue(name))
        )

    def _unsubscribed(self, key: ConsumerKey, *, remove: bool) -> None:
        for name, holder in list(self.active.items()):
            if holder == key:
                del self.active[name]
                if remove:
                    self._remove(name)

    def _remove(self, name: str) -> None:
        topic = self.destination_of.pop(name, None)
        if topic is not None:
            self.by_topic[topic].discard(name)
        dropped = self.queues.purge(durable_queue(name))
        self.registry.remove(name)
        log.info("durable subscription %r removed with %d waiting messages", name, dropped)

    def _is_active(self, name: str) -> bool:
        holder = self.active.get(name)
        return holder is not None and holder in self.queues.consumers
