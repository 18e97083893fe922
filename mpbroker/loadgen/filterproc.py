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

from mpbroker.harness import RawClient, StompError
from mpbroker.stomp import Frame, encode_frame

from .control import STARTUP_TIMEOUT_S, ConsumerResult, Control, ProducerResult, Ready, describe
from .filters import KEY_PREFIX, KEY_PROPERTY, FilterPlan, FilterTally
from .producer import BATCH_BYTES
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
# A read that waits this long without data looks at the stop flag.
_IDLE_S = 0.05
_BACKLOG_POLL_S = 0.0005


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


class _Subscriber:
    def __init__(
        self,
        index: int,
        point: FilterPoint,
        host: str,
        port: int,
        token: bytes,
        control: Control,
    ) -> None:
        self.index = index
        self.point = point
        self.control = control
        self.tally = FilterTally(body_prefix(token), point.plan, point.count)
        self.last_receive = 0.0
        self.reads = 0
        self.conn = RawClient(host, port, point.stall_timeout_s, send_timeout=None)

    def run(self) -> FilterConsumerResult:
        point = self.point
        conn = self.conn
        try:
            conn.connect()
            chunks = subscribe_frames(point, self.index)
            began = time.monotonic()
            for chunk in chunks:
                send_explained(conn, chunk)
            # Registering 10,000 selectors takes a while on a loaded machine.
            conn.expect(
                "RECEIPT", _SUBSCRIBED, timeout=max(point.stall_timeout_s, STARTUP_TIMEOUT_S)
            )
            subscribe_s = time.monotonic() - began
            self.control.results.put(Ready("consumer", self.index))
            cpu_start = time.process_time()
            self._receive()
            conn.disconnect()
            return FilterConsumerResult(
                self.index,
                last_receive=self.last_receive,
                cpu_s=time.process_time() - cpu_start,
                reads=self.reads,
                filter_tally=self.tally,
                subscribe_s=subscribe_s,
                subscriptions=len(point.subscribers_of(self.index)),
            )
        finally:
            conn.close()

    def _receive(self) -> None:
        conn = self.conn
        tally = self.tally
        stop = self.control.stop
        received = self.control.received
        index = self.index
        while True:
            frames = conn.read(_IDLE_S)
            if frames is None:
                if stop.is_set():
                    return
                continue
            deliveries = [
                (frame.headers.get("subscription", ""), frame.body)
                for frame in frames
                if frame.command == "MESSAGE"
            ]
            if deliveries:
                self.last_receive = time.monotonic()
                self.reads += 1
                tally.add(deliveries)
                received[index] = tally.received
            if len(deliveries) != len(frames):
                for frame in frames:
                    if frame.command == "ERROR":
                        raise StompError(frame)
            if stop.is_set():
                return


def filter_producer_main(
    index: int, point: FilterPoint, host: str, port: int, token: bytes, control: Control
) -> None:
    """Process entry point: send, then report a :class:`ProducerResult` (with any error)."""
    result: ProducerResult
    try:
        result = _Publisher(index, point, host, port, token, control).run()
    except Exception as exc:
        result = ProducerResult(index, sent=control.sent[index], error=describe(exc))
    control.results.put(result)


class _Publisher:
    def __init__(
        self,
        index: int,
        point: FilterPoint,
        host: str,
        port: int,
        token: bytes,
        control: Control,
    ) -> None:
        self.index = index
        self.point = point
        self.control = control
        self.conn = RawClient(host, port, point.stall_timeout_s, send_timeout=None)
        plan = point.plan
        self.template = KeyedSendTemplate(
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
        self.outstanding = 0
        self.first_send = 0.0

    def run(self) -> ProducerResult:
        point = self.point
        control = self.control
        conn = self.conn
        try:
            conn.connect()
            control.results.put(Ready("producer", self.index))
            if not control.start.wait(max(point.stall_timeout_s, 2 * STARTUP_TIMEOUT_S)):
                raise TimeoutError("the coordinator never said start")
            count = point.count
            every = point.receipt_every
            batch = max(1, BATCH_BYTES // self.template.frame_bytes)
            sent = control.sent
            seq = 0
            self.first_send = first_send = time.monotonic()
            cpu_start = time.process_time()
            while seq < count:
                if seq >= point.min_count and time.monotonic() - first_send >= point.budget_s:
                    break
                window_end = min((seq // every + 1) * every, count)
                ahead = self._wait_for_room()
                stop = min(seq + min(batch, ahead), window_end)
                if stop == window_end:
                    while self.outstanding >= point.max_in_flight:
                        self._take_receipts(point.stall_timeout_s, "RECEIPT")
                    last = stop - 1
                    data = self.template.frames(seq, last) + self.template.frame_with_receipt(
                        last, str(last)
                    )
                    self.outstanding += 1
                else:
                    data = self.template.frames(seq, stop)
                send_explained(conn, data)
                seq = stop
                sent[self.index] = seq
                if self.outstanding:
                    self._take_receipts(0.0, "")
            while self.outstanding:
                self._take_receipts(point.stall_timeout_s, "RECEIPT")
            done = time.monotonic()
            conn.disconnect()
            return ProducerResult(
                self.index,
                sent=seq,
                first_send=first_send,
                done=done,
                cpu_s=time.process_time() - cpu_start,
            )
        finally:
            conn.close()

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
            self._take_receipts(_BACKLOG_POLL_S, "")

    def _take_receipts(self, timeout_s: float, waiting_for: str) -> None:
        frames = self.conn.read(timeout_s)
        if frames is None:
            if waiting_for:
                raise TimeoutError(f"no {waiting_for} from the server for {timeout_s:g} s")
            return
        for frame in frames:
            if frame.command == "RECEIPT":
                self.outstanding -= 1
            elif frame.command == "ERROR":
                raise StompError(frame)
