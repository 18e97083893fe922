"""Publish/subscribe engine: non-persistent topics and their subscribers."""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from mpbroker.config import TopicSettings
from mpbroker.flow import FlowChange, Level, Watermark
from mpbroker.records import Deliver, Message, Refuse, Send, message_size

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
        # The live buffer's watermarks, per topic, on its slowest subscriber's backlog:
        # a level exists only while a topic is near or over its high watermark.
        self.live_mark = Watermark(settings.live_msg_high, settings.live_msg_low)
        # Per topic ([destinations] settings); asked when a topic's level is created.
        self.live_mark_for: Callable[[str], Watermark] = lambda topic: self.live_mark
        self.live_levels: dict[str, Level] = {}
        self.flow_changes: list[FlowChange] = []
        # Over all topics: messages waiting in subscribers' backlogs, and its watermark.
        self.live_total = 0
        self.global_live = Level(
            Watermark(settings.global_live_msg_high, settings.global_live_msg_low),
            "global_live_msg_high",
        )

    def _send(self, gateway: int, record: Send) -> None:
        message = record.message
        if not message.size:
            message.size = message_size(message)  # once, for every subscriber's byte window
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
            if consumer.pending or not consumer.ready:
                consumer.pending.append(message)
                self.live_total += 1
                continue
            consumer.take(message)
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
        self._check_live(message.destination)

    def _settled(self, consumer: Consumer, messages: list[Message], *, nack: bool) -> None:
        if nack:
            # A non-durable subscriber gets a NACKed message again, before newer ones.
            consumer.pending.extendleft(
                msgspec.structs.replace(m, redelivered=True) for m in reversed(messages)
            )
            self.live_total += len(messages)
        self._drain(consumer)

    def _added(self, consumer: Consumer) -> None:
        self.topics.setdefault(consumer.destination, []).append(consumer)

    def _drain(self, consumer: Consumer) -> None:
        """Move backlog into the window while it has room."""
        gateway, conn, sub = consumer.key
        moved = bool(consumer.pending)
        while consumer.pending and consumer.ready:
            message = consumer.pending.popleft()
            self.live_total -= 1
            consumer.take(message)
            self.outbox.add(gateway, Deliver([(conn, sub)], message))
            self.delivered += 1
        if moved:
            self._check_live(consumer.destination)

    def _check_live(self, topic: str) -> None:
        """Stop the topic's publishers when its slowest subscriber is `live_msg_high`
        behind; let them go once it is back to `live_msg_low`. The same for every
        publisher when all backlogs together reach `global_live_msg_high`."""
        change = self.global_live.update(self.live_total)
        if change is not None:
            self.flow_changes.append(FlowChange("", self.global_live.reason if change else ""))
        level = self.live_levels.get(topic)
        if level is None and not self.topics.get(topic):
            return
        deepest = max((len(c.pending) for c in self.topics.get(topic, ())), default=0)
        if level is None:
            mark = self.live_mark_for(topic)
            if not mark.enabled or deepest < mark.high:
                return
            level = self.live_levels[topic] = Level(mark, "live_msg_high")
        change = level.update(deepest)
        if change is True:
            self.flow_changes.append(FlowChange(topic, level.reason))
        elif change is False:
            self.flow_changes.append(FlowChange(topic, ""))
            del self.live_levels[topic]

    def reconfigure_live(
        self, mark: Watermark, mark_for: Callable[[str], Watermark], global_mark: Watermark
    ) -> None:
        """New live-buffer watermarks (a configuration reload): topics are judged again."""
        self.live_mark = mark
        self.live_mark_for = mark_for
        self.global_live.mark = global_mark
        for topic, level in list(self.live_levels.items()):
            level.mark = mark_for(topic)
            self._check_live(topic)
        for topic in self.topics:
            self._check_live(topic)

    def live_stops(self) -> dict[str, str]:
        """Topics whose publishers are stopped now, and why ("" for every topic)."""
        stops = {topic: level.reason for topic, level in self.live_levels.items() if level.armed}
        if self.global_live.armed:
            stops[""] = self.global_live.reason
        return stops

    def _removed(self, consumers: list[Consumer], *, requeue_auto: bool) -> None:
        # A non-durable subscription's backlog and window go with it.
        for consumer in consumers:
            self.live_total -= len(consumer.pending)
            subscribers = self.topics[consumer.destination]
            subscribers.remove(consumer)
            if not subscribers:
                del self.topics[consumer.destination]
        for topic in {c.destination for c in consumers}:
            self._check_live(topic)
