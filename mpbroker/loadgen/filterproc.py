"""The processes of one filter-study point: one producer, a few subscriber connections.

A subscriber process holds one connection with every ``connections``-th subscription of the
point (subscriber ``i`` on connection ``i % connections``): it sends all its SUBSCRIBE frames
in large writes, asks for a RECEIPT on the last one only (the broker handles a connection's
frames in order, so that receipt means all are registered), and then reads MESSAGE frames,
tallying each under its ``subscription`` header.

The producer sends until ``count`` messages, or until ``budget_s`` have passed once it sent
at least ``min_count``: a point where the broker needs 20 ms per message then takes about as
long as one where it needs 20 us. It stays at most about :data:`AHEAD_S` seconds of deliveries
ahead of the subscribers (at least :data:`MIN_AHEAD` messages, at most ``max_backlog``), so
little is left in flight when it stops.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from mpbroker.harness import RawClient
from mpbroker.stomp import Frame, encode_frame

from .consumer import Receiver
from .control import STARTUP_TIMEOUT_S, ConsumerResult, Control, describe
from .filters import KEY_PREFIX, KEY_PROPERTY, FilterPlan, FilterTally
from .producer import PacedProducer, run_producer
from .wire import KeyedSendTemplate, body_prefix, send_explained

__all__ = [
    "AHEAD_S",
    "MIN_AHEAD",
    "FilterConsumerResult",
    "FilterPoint",
    "filter_consumer_main",
    "filter_producer_main",
]

#: How far (in seconds of the measured delivery rate) the producer may run ahead.
AHEAD_S = 0.5
#: ... but always at least this many messages.
MIN_AHEAD = 64
# SUBSCRIBE frames are written in chunks of about this many bytes.
_SUBSCRIBE_CHUNK_BYTES = 64 * 1024
_SUBSCRIBED = "subscribed"


@dataclass(frozen=True, slots=True)
class FilterPoint:
    """One point of the study: the plan, where, and how much. Picklable."""

    plan: FilterPlan
    destination: str
    #: Subscriber connections (one process each); at most ``plan.subscribers``.
    connections: int
    #: Most messages to send, and the fewest before the time budget may stop the producer.
    count: int
    min_count: int
    budget_s: float
    size_bytes: int = 100
    persistent: bool = False
    prefetch: int = 1000
    receipt_every: int = 1000
    max_in_flight: int = 4
    max_backlog: int = 5000
    stall_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if not 1 <= self.connections <= self.plan.subscribers:
            raise ValueError(
                f"{self.connections} connections for {self.plan.subscribers} subscribers:"
                " every connection needs at least one"
            )
        if not 1 <= self.min_count <= self.count:
            raise ValueError(f"min_count {self.min_count} is not within 1 .. {self.count}")

    @property
    def topic(self) -> bool:
        return self.destination.startswith("/topic/")

    @property
    def deliveries_per_message(self) -> int:
        return self.plan.deliveries_per_message(topic=self.topic)

    def subscribers_of(self, connection: int) -> range:
        """The subscriber indexes connection ``connection`` subscribes."""
        return range(connection, self.plan.subscribers, self.connections)


@dataclass(frozen=True, slots=True)
class FilterConsumerResult(ConsumerResult):
    """A subscriber connection's report (``tally`` of the base class stays None)."""

    filter_tally: FilterTally | None = None
    #: Seconds from the first SUBSCRIBE written to the RECEIPT of the last.
    subscribe_s: float = 0.0
    subscriptions: int = 0


def subscribe_frames(point: FilterPoint, connection: int) -> list[bytes]:
    """The SUBSCRIBE frames of ``connection``, the last asking for a RECEIPT, encoded and
    joined into chunks of about :data:`_SUBSCRIBE_CHUNK_BYTES`."""
    plan = point.plan
    subscribers = point.subscribers_of(connection)
    chunks: list[bytes] = []
    chunk: list[bytes] = []
    size = 0
    last = subscribers[-1] if subscribers else -1
    for i in subscribers:
        headers = {
            "id": str(i),
            "destination": point.destination,
            "ack": "auto",
            "activemq.prefetchSize": str(point.prefetch),
        }
        selector = plan.selector(i)
        if selector is not None:
            headers["selector"] = selector
        if i == last:
            headers["receipt"] = _SUBSCRIBED
        frame = encode_frame(Frame("SUBSCRIBE", headers))
        chunk.append(frame)
        size += len(frame)
        if size >= _SUBSCRIBE_CHUNK_BYTES:
            chunks.append(b"".join(chunk))
            chunk, size = [], 0
    if chunk:
        chunks.append(b"".join(chunk))
    return chunks


def filter_consumer_main(
    index: int, point: FilterPoint, host: str, port: int, token: bytes, control: Control
) -> None:
    """Process entry point: subscribe, receive until told to stop, report."""
    consumer: _Subscriber | None = None
    result: FilterConsumerResult
    try:
        consumer = _Subscriber(index, point, host, port, token, control)
        result = consumer.run()
    except Exception as exc:
        result = FilterConsumerResult(
            index,
            last_receive=consumer.last_receive if consumer is not None else 0.0,
            error=describe(exc),
            filter_tally=consumer.tally if consumer is not None else None,
        )
    control.results.put(result)


class _Subscriber(Receiver[FilterTally, FilterConsumerResult]):
    """A subscriber connection: its share of the point's subscriptions, each delivery
    tallied under its ``subscription`` header."""

    def __init__(
        self,
        index: int,
        point: FilterPoint,
        host: str,
        port: int,
        token: bytes,
        control: Control,
    ) -> None:
        self.point = point
        super().__init__(
            index,
            host,
            port,
            point.stall_timeout_s,
            control,
            FilterTally(body_prefix(token), point.plan, point.count),
        )
        self.subscribe_s = 0.0

    def _subscribe(self) -> None:
        point = self.point
        conn = self.conn
        chunks = subscribe_frames(point, self.index)
        began = time.monotonic()
        for chunk in chunks:
            send_explained(conn, chunk)
        # Registering 10,000 selectors takes a while on a loaded machine.
        conn.expect("RECEIPT", _SUBSCRIBED, timeout=max(point.stall_timeout_s, STARTUP_TIMEOUT_S))
        self.subscribe_s = time.monotonic() - began

    def _deliveries(self, frames: list[Frame]) -> list[Any]:
        return [
            (frame.headers.get("subscription", ""), frame.body)
            for frame in frames
            if frame.command == "MESSAGE"
        ]

    def _result(self, cpu_s: float) -> FilterConsumerResult:
        return FilterConsumerResult(
            self.index,
            last_receive=self.last_receive,
            cpu_s=cpu_s,
            reads=self.reads,
            filter_tally=self.tally,
            subscribe_s=self.subscribe_s,
            subscriptions=len(self.point.subscribers_of(self.index)),
        )


def filter_producer_main(
    index: int, point: FilterPoint, host: str, port: int, token: bytes, control: Control
) -> None:
    """Process entry point: send, then report a :class:`ProducerResult` (with any error)."""
    run_producer(index, control, lambda: _Publisher(index, point, host, port, token, control))


class _Publisher(PacedProducer):
    """The point's producer: sends until ``count``, or until ``budget_s`` once it sent
    ``min_count``, staying about :data:`AHEAD_S` seconds of deliveries ahead."""

    def __init__(
        self,
        index: int,
        point: FilterPoint,
        host: str,
        port: int,
        token: bytes,
        control: Control,
    ) -> None:
        self.point = point
        conn = RawClient(host, port, point.stall_timeout_s, send_timeout=None)
        plan = point.plan
        template = KeyedSendTemplate(
            point.destination,
            key_header=KEY_PROPERTY,
            key_prefix=KEY_PREFIX,
            keys=plan.keys,
            headers=plan.fixed_headers(),
            persistent=point.persistent,
            token=token,
            producer=index,
            size=point.size_bytes,
        )
        super().__init__(
            index,
            conn,
            template,
            control,
            count=point.count,
            receipt_every=point.receipt_every,
            max_in_flight=point.max_in_flight,
            stall_timeout_s=point.stall_timeout_s,
        )

    def _stop_early(self, seq: int) -> bool:
        point = self.point
        return seq >= point.min_count and time.monotonic() - self.first_send >= point.budget_s

    def _pace(self, seq: int, stop: int) -> int:
        return min(stop, seq + self._wait_for_room())

    def _delivered(self) -> int:
        """Messages the subscribers have received, by the shared counters."""
        return sum(self.control.received) // self.point.deliveries_per_message

    def _limit(self, delivered: int) -> int:
        """How many messages we may be ahead of the subscribers now."""
        point = self.point
        elapsed = time.monotonic() - self.first_send
        rate = delivered / elapsed if elapsed > 0.05 else 0.0
        return max(MIN_AHEAD, min(point.max_backlog, int(rate * AHEAD_S)))

    def _wait_for_room(self) -> int:
        """Wait until we may send more; returns how many."""
        point = self.point
        sent = self.control.sent
        waited_since = time.monotonic()
        while True:
            delivered = self._delivered()
            room = self._limit(delivered) - (sent[self.index] - delivered)
            if room > 0:
                return room
            if self.control.stop.is_set():
                raise TimeoutError("the run was stopped")
            if time.monotonic() - waited_since > point.stall_timeout_s:
                raise TimeoutError(
                    f"subscribers made no progress for {point.stall_timeout_s:g} s"
                    f" ({sent[self.index] - delivered} messages behind)"
                )
            self._poll()
