from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Final

from mpbroker.flow import DestinationLimit
from mpbroker.records import (
    ACK_AUTO,
    ACK_CLIENT,
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
)
from mpbroker.selector import Selector, SelectorError, compile_selector

from ._totals import DEQUEUED, DestinationTotals

# (gateway index, connection id, subscription handle): unique across the broker.
ConsumerKey = tuple[int, int, int]


def no_byte_window(destination: str) -> int:
    """The byte window of every subscription when none is configured: messages only."""
    return -1


class Outbox:
    """Records an engine wants sent, grouped by the gateway that must receive them.

    `deliver` lets deliveries of one message to several subscriptions share one `Deliver`
    record per gateway, also when they are made one subscription at a time (a topic's
    subscribers draining their backlogs as their credits come back): one record to encode,
    copy through the ring and decode, and one MESSAGE frame to encode in the gateway,
    instead of one per subscriber. A delivery joins an earlier record only past nothing
    said to its own connection since (records to one connection keep their order; records
    to different connections have none to keep: they go to different sockets).
    """

    __slots__ = ("_joins", "before_take", "by_gateway")

    def __init__(self) -> None:
        self.by_gateway: dict[int, list[Record]] = {}
        # Called first by `take`: an engine that defers work (a topic's drains, so that
        # they are made together) finishes it before its records are taken.
        self.before_take: Callable[[], None] | None = None
        # Per gateway, what a later delivery may join (only for gateways that had one).
        self._joins: dict[int, _Joins] = {}

    def add(self, gateway: int, record: Record) -> None:
        batch = self.by_gateway.get(gateway)
        if batch is None:
            batch = self.by_gateway[gateway] = []
        position = len(batch)
        batch.append(record)
        joins = self._joins.get(gateway)
        if joins is None:
            return  # nothing can join an earlier record there yet: no order to keep
        if isinstance(record, Receipt | Refuse | BarrierDone):
            joins.last_to[record.conn] = position
        elif isinstance(record, Deliver):
            for conn, _ in record.targets:
                joins.last_to[conn] = position
        else:
            joins.fence = position + 1

    def deliver(self, gateway: int, conn: int, sub: int, message: Message) -> None:
        """`message` for subscription `sub` of connection `conn`: joined to an earlier
        record of the same message to that gateway where order allows, else a new one."""
        batch = self.by_gateway.get(gateway)
        if batch is None:
            batch = self.by_gateway[gateway] = []
        joins = self._joins.get(gateway)
        if joins is None:
            joins = self._joins[gateway] = _Joins()
        last_to = joins.last_to
        position = joins.open.get(id(message))
        if position is not None and position >= joins.fence and position >= last_to.get(conn, -1):
            record = batch[position]
            assert isinstance(record, Deliver)
            record.targets.append((conn, sub))
        else:
            position = len(batch)
            joins.open[id(message)] = position
            batch.append(Deliver([(conn, sub)], message))
        last_to[conn] = position

    def take(self) -> dict[int, list[Record]]:
        """Everything collected so far; the outbox is empty afterwards."""
        if self.before_take is not None:
            self.before_take()
        out, self.by_gateway = self.by_gateway, {}
        if self._joins:
            self._joins = {}
        return out


class _Joins:
    """What `Outbox.deliver` may join in one gateway's records (until `take`)."""

    __slots__ = ("fence", "last_to", "open")

    def __init__(self) -> None:
        # Per message object: the position of the Deliver record a later delivery of that
        # message may join (the records keep the messages alive, so their ids stay theirs
        # until `take`).
        self.open: dict[int, int] = {}
        # The first position a delivery may join: a record for no single connection (a
        # flow change) fences everything before it.
        self.fence = 0
        # Per connection, the position of the last record to it.
        self.last_to: dict[int, int] = {}


@dataclass(eq=False, slots=True)
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
    # The window in bytes too (-1: messages only); a message larger than the whole window
    # still goes when the window is empty.
    window_bytes: int = -1
    unacked: dict[str, Message] = field(default_factory=dict)
    unacked_bytes: int = 0
    # Topic subscribers only: messages waiting for room in the window.
    pending: deque[Message] = field(default_factory=deque)
    # The SUBSCRIBE's message selector (None: every message is selected).
    selector: Selector | None = None
    # A durable subscription whose subscriber is away (TopicEngine.park): never ready, it
    # keeps the non-persistent messages it selects in `pending` (persistent ones wait in
    # the store), bounded and paged as any backlog.
    parked: bool = False

    @property
    def ready(self) -> bool:
        """Room in the window: the consumer may be handed another message."""
        return len(self.unacked) < self.prefetch and (
            self.window_bytes < 0 or self.unacked_bytes < self.window_bytes
        )

    def take(self, message: Message) -> None:
        """`message` was handed to this consumer: it is in the window until settled."""
        self.unacked[message.message_id] = message
        self.unacked_bytes += message.size

    def release_all(self) -> list[Message]:
        """Empty the window (the consumer goes away); its messages, oldest first."""
        messages = list(self.unacked.values())
        self.unacked.clear()
        self.unacked_bytes = 0
        return messages

    def settle(self, message_id: str) -> list[Message]:
        """Remove what an ACK/NACK of `message_id` settles (cumulative in client mode).

        Unknown ids settle nothing: a stale id after a pipeline restart, or a duplicate ack.
        """
        if self.ack_mode == ACK_AUTO or message_id not in self.unacked:
            return []
        if self.ack_mode != ACK_CLIENT:
            return self._left([self.unacked.pop(message_id)])
        settled: list[Message] = []
        for mid in list(self.unacked):
            settled.append(self.unacked.pop(mid))
            if mid == message_id:
                break
        return self._left(settled)

    def credit(self, count: int) -> list[Message]:
        """Auto mode: the oldest `count` deliveries were written; returns those messages."""
        if self.ack_mode != ACK_AUTO:
            return []
        unacked = self.unacked
        if count >= len(unacked):
            return self.release_all()
        return self._left([unacked.pop(key) for key in list(itertools.islice(unacked, count))])

    def _left(self, messages: list[Message]) -> list[Message]:
        self.unacked_bytes -= sum(m.size for m in messages)
        return messages


# Connections followed at once by `Engine.closing_for_broker_failure`.
MAX_CLOSED_BY_BROKER: Final = 4096


class Engine(ABC):
    """What every pipeline engine does with consumers, acks, receipts and barriers.

    Subclasses say what a message, a settlement and a departing consumer mean for their
    kind of destination.
    """

    role: ClassVar[str]

    def __init__(
        self,
        pipeline: int,
        outbox: Outbox,
        window_bytes_for: Callable[[str], int] = no_byte_window,
    ) -> None:
        self.pipeline = pipeline
        self.outbox = outbox
        self.consumers: dict[ConsumerKey, Consumer] = {}
        # The byte window of a new subscription to a destination (-1: none).
        self.window_bytes_for = window_bytes_for
        self.delivered = 0
        self.received = 0
        # Per destination: enqueued, dequeued, expired, ... since the worker started.
        self.totals = DestinationTotals()
        # The worker's clock, set before each batch (`tick`: an engine reads no clock).
        self.now_ms = 0
        # Connections the broker is closing for its own failure (an ERROR for an ACK its
        # store could not write): what their consumers leave comes back uncounted.
        self.closed_by_broker: set[tuple[int, int]] = set()
        # broker.max_destinations, when this engine's destinations count against it (the
        # pipeline's; None: they do not, as a durable subscription's own queue).
        self.destination_limit: DestinationLimit | None = None

    def tick(self, now_ms: int) -> None:
        """The worker's clock, before each batch: expiry compares with it."""
        self.now_ms = now_ms

    @abstractmethod
    def expire_scan(self, now_ms: int) -> int:
        """Drop every waiting message whose time is up; returns how many."""

    def configure_windows(self, window_bytes_for: Callable[[str], int]) -> None:
        """New byte windows (a configuration reload), for subscriptions from now on."""
        self.window_bytes_for = window_bytes_for

    def handle(self, gateway: int, record: Record) -> None:
        match record:
            case Send():
                self._send(gateway, record)
            case Ack() | Nack():
                consumer = self.consumers.get((gateway, record.conn, record.sub))
                settled = consumer.settle(record.message_id) if consumer is not None else []
                if consumer is not None and settled:
                    nack = isinstance(record, Nack)
                    requeue = record.requeue if isinstance(record, Nack) else True
                    if not nack:
                        self.totals.add(consumer.destination, DEQUEUED, len(settled))
                    self._settled(consumer, settled, nack=nack, requeue=requeue)
                    stored = [m for m in settled if m.seq]
                    if stored:
                        # Its RECEIPT (or ERROR) waits until the store has its effect.
                        self._stored_ack(gateway, record, consumer.destination, stored)
                        return
                self._receipt(gateway, record.conn, record.receipt)
            case Credit():
                for sub, count in record.subs:
                    consumer = self.consumers.get((gateway, record.conn, sub))
                    if consumer is not None:
                        written = consumer.credit(count)
                        if written:
                            self.totals.add(consumer.destination, DEQUEUED, len(written))
                            self._settled(consumer, written, nack=False)
            case Subscribe():
                key = (gateway, record.conn, record.sub)
                # Re-registration after a pipeline restart may repeat a Subscribe still in
                # the ring: keep the consumer we have.
                selector = self.selector_of(gateway, record)
                if record.selector and selector is None:
                    return
                if (
                    self.destination_limit is not None
                    and key not in self.consumers
                    and self.refuses_new(
                        gateway, record.conn, record.destination, record.receipt, "SUBSCRIBE"
                    )
                ):
                    return
                # The receipt goes first: what the subscription is handed at once (a
                # waiting backlog) follows it.
                self._receipt(gateway, record.conn, record.receipt)
                if key not in self.consumers:
                    consumer = Consumer(
                        key,
                        record.sub_id,
                        record.destination,
                        record.ack_mode,
                        record.prefetch,
                        self.window_bytes_for(record.destination),
                        selector=selector,
                    )
                    self.consumers[key] = consumer
                    self._added(consumer)
            case Unsubscribe():
                self._remove([(gateway, record.conn, record.sub)], requeue_auto=True)
                self._receipt(gateway, record.conn, record.receipt)
            case ConnClosed():
                keys = [k for k in self.consumers if k[0] == gateway and k[1] == record.conn]
                ours = (gateway, record.conn) in self.closed_by_broker
                self.closed_by_broker.discard((gateway, record.conn))
                self._remove(keys, requeue_auto=True, counted=not ours)
            case Hello():
                # The gateway died: auto-mode deliveries it held may have reached a client,
                # so they must not come back (at most once); client-mode ones do.
                self._remove([k for k in self.consumers if k[0] == gateway], requeue_auto=False)
            case Barrier():
                self.outbox.add(gateway, BarrierDone(record.conn, record.token, self.pipeline))
            case _:
                raise ValueError(f"{self.role} pipeline cannot handle {type(record).__name__}")

    def holds(self, destination: str) -> bool:
        """Whether `destination` exists here (one more is counted against the limit)."""
        return True

    def refuses_new(
        self, gateway: int, conn: int, destination: str, receipt: str, frame: str
    ) -> bool:
        """Whether a `frame` (SEND or SUBSCRIBE) to `destination` is refused because it
        would make one destination more than `destination_limit` lets exist (or MemWatch
        lets be made): then a Refuse goes to the client. One that exists is never refused."""
        limit = self.destination_limit
        if limit is None or self.holds(destination):
            return False
        refusal = limit.refusal(destination, frame)
        if refusal is None:
            return False
        self.outbox.add(gateway, Refuse.of(conn, refusal, receipt))
        return True

    def selector_of(self, gateway: int, record: Subscribe) -> Selector | None:
        """The subscription's compiled selector (None: none, or refused). The gateway
        checked it, so a refusal here means the two disagree: refused all the same (a
        Refuse to the subscriber), never ignored."""
        if not record.selector:
            return None
        try:
            return compile_selector(record.selector)
        except SelectorError as exc:
            self.outbox.add(
                gateway, Refuse(record.conn, str(exc), "Nothing was subscribed.", record.receipt)
            )
            return None

    def closing_for_broker_failure(self, gateway: int, conn: int) -> None:
        """The broker refused a frame of this connection for its own failure (a store
        that could not write), which ends the connection: the deliveries its consumers
        leave behind will not count against `max_redeliveries`."""
        if len(self.closed_by_broker) >= MAX_CLOSED_BY_BROKER:
            # Entries whose ConnClosed never came (the connection was gone already).
            self.closed_by_broker.clear()
        self.closed_by_broker.add((gateway, conn))

    def _remove(self, keys: list[ConsumerKey], *, requeue_auto: bool, counted: bool = True) -> None:
        removed = [c for c in (self.consumers.pop(key, None) for key in keys) if c is not None]
        if removed:
            self._removed(removed, requeue_auto=requeue_auto, counted=counted)

    def _receipt(self, gateway: int, conn: int, receipt: str) -> None:
        if receipt:
            self.outbox.add(gateway, Receipt(conn, receipt))

    def _stored_ack(
        self, gateway: int, record: Ack | Nack, queue: str, messages: list[Message]
    ) -> None:
        """An ACK or NACK settled or returned stored `messages` of `queue`. An engine whose
        worker writes that to a store answers once it is written; others at once."""
        self._receipt(gateway, record.conn, record.receipt)

    @abstractmethod
    def _send(self, gateway: int, record: Send) -> None:
        """A producer's message arrived."""

    @abstractmethod
    def _settled(
        self, consumer: Consumer, messages: list[Message], *, nack: bool, requeue: bool = True
    ) -> None:
        """Messages left `consumer`'s window: acknowledged or written (nack=False), or
        refused by the client (nack=True): to be given again, or (requeue=False) not."""

    @abstractmethod
    def _added(self, consumer: Consumer) -> None:
        """A new consumer was registered."""

    @abstractmethod
    def _removed(
        self, consumers: list[Consumer], *, requeue_auto: bool, counted: bool = True
    ) -> None:
        """Consumers went away (already out of `self.consumers`), with their windows
        (`counted`: their consumers' doing, not the broker's)."""
