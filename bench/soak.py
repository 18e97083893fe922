"""Slow-consumer soak: producers at full speed, one consumer at 10 % of their rate.

Run: .venv/bin/python -m bench.soak [--minutes 5] [--producers 2] [--size 1000] [--persistent]
     [--send-timeout-ms 2000] [--destination /queue/soak]

Starts a broker whose flow-control watermarks are small (a ``[destinations]`` table for the
soak queue: ``msg_high`` 10000, ``msg_low`` 7500, in whichever store holds its messages;
``flow.send_timeout_ms`` from the option), so flow control engages within seconds. Producer processes send as fast as they can, every SEND
with a receipt, at most :data:`WINDOW` unanswered per connection; a refused SEND gets an ERROR
(with the SEND's ``receipt-id``) and the broker closes the connection, so the producer counts
it as refused and reconnects. One consumer process (``client-individual``, an ACK per message)
first drains at full speed for ``--calibrate-seconds`` to measure the rate the producers
reach, then acknowledges at 10 % of it (sleep-paced; it holds a window of 1000) for
``--minutes``. Meanwhile, every second, the proportional set size (PSS: shared memory split
between the processes that map it) of all broker processes is summed, and the broker's log is
read for ``flow: producers to ... stopped`` / ``... may go again`` lines.

At the end the producers stop (settling what is in flight), the consumer drains the backlog
at full speed, and every message is reconciled: each SEND was accepted (RECEIPT), refused
(ERROR), dropped (sent after a refused SEND on the same connection: the broker closes it after
the ERROR and reads nothing more) or unknown (the connection broke without an answer; should
be 0); every accepted message must have arrived exactly once, and nothing else may arrive.

Exit status 0 when nothing was lost, duplicated or delivered without having been accepted and
no process failed; 1 otherwise.

The parts are reusable (``bench.memsoak`` builds on them): :class:`Options` may name several
destinations, which every producer sends to round robin, and several consumer processes, each
subscribed to some of them; :class:`SoakRun` is the coordinator, with hooks for the broker it
starts, its progress lines and its summary; :func:`reconcile` checks every message against the
kind of its destination.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import json
import multiprocessing
import multiprocessing.queues
import queue
import re
import secrets
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from multiprocessing.context import SpawnContext
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event
from typing import Any

import psutil

from mpbroker.harness import BrokerProcess, FrameTimeout, RawClient, ServerError, StompError
from mpbroker.loadgen.control import Counters, describe
from mpbroker.loadgen.cpu import process_memory
from mpbroker.loadgen.wire import BODY_HEADER_BYTES, body_prefix, make_body, send_explained
from mpbroker.stomp import Frame, ProtocolError, encode_frame

__all__ = [
    "CONSUMER_SHARE",
    "PREFETCH",
    "STARTUP_TIMEOUT_S",
    "WINDOW",
    "BrokerLog",
    "ConsumerReport",
    "MemorySampler",
    "Options",
    "Phases",
    "ProducerReport",
    "Reconciliation",
    "SoakRun",
    "format_summary",
    "main",
    "mib",
    "reconcile",
    "soak_config",
]

#: Most SENDs a producer has sent and not yet seen answered (RECEIPT or ERROR).
WINDOW = 100
#: A consumer's window of unacknowledged deliveries per subscription (ActiveMQ's default
#: queue prefetch).
PREFETCH = 1000
#: Watermarks of the soak queue: producers stop at HIGH messages and go again at LOW. With
#: 1000-byte bodies HIGH stays below the p2p worker's global byte watermark (16 MiB), so the
#: queue's own limit is the one that engages.
MSG_HIGH = 10000
MSG_LOW = 7500
#: The consumer's share of the producers' rate.
CONSUMER_SHARE = 0.10
#: How long processes get to connect and subscribe (spawned processes import Python first).
STARTUP_TIMEOUT_S = 60.0

_SAMPLE_S = 1.0
_PROGRESS_S = 30.0
# The consumer's pacing tick: how long a read may wait while messages are waiting for acks.
_TICK_S = 0.01
# Drain: give up when nothing more arrived for this long.
_DRAIN_STALL_S = 60.0
# After the consumer has everything that was accepted: time for duplicates to show up.
_DUPLICATE_GRACE_S = 1.0

# Status of one message (SEND) of a producer, one byte per sequence number.
_IN_FLIGHT = 0
_ACCEPTED = 1
_REFUSED = 2
_DROPPED = 3
_UNKNOWN = 4
# Status byte -> how often that message must arrive: accepted ones once, others never.
_EXACTLY_ONCE = bytes(1 if status == _ACCEPTED else 0 for status in range(256))

_FLOW_STOP = re.compile(r"flow: producers to (.+?) stopped: (.+?) reached")
_FLOW_GO = re.compile(r"flow: producers to (.+?) may go again")
_LOG_LEVEL = re.compile(r"\s(WARNING|ERROR|CRITICAL)\s")
_REFUSED_SEND = "refused a SEND from"
# The broker collapses repeats (mpbroker.logs): "refused a SEND: … and 95 more like it from …".
_REFUSED_SENDS_MORE = re.compile(r"refused a SEND: \S* and ([\d,]+) more like it")


def soak_config(*, send_timeout_ms: int, destination: str) -> str:
    """The broker configuration of a soak: small watermarks for ``destination``."""
    name = json.dumps(destination)  # a TOML basic string is a JSON string for these names
    return (
        "[flow]\n"
        f"send_timeout_ms = {send_timeout_ms}\n"
        "\n"
        f"[destinations.{name}]\n"
        f"msg_high = {MSG_HIGH}\n"
        f"msg_low = {MSG_LOW}\n"
    )


@dataclass(frozen=True, slots=True)
class Options:
    """What the producer and consumer processes of a soak need to know."""

    destinations: tuple[str, ...]
    #: Per consumer process, the indexes in ``destinations`` it subscribes to (each
    #: destination exactly once over all of them).
    consumer_groups: tuple[tuple[int, ...], ...]
    size: int
    persistent: bool
    producers: int
    #: The broker's ``flow.send_timeout_ms``: bounds how long a SEND may go unanswered.
    send_timeout_ms: int

    @classmethod
    def single(
        cls, destination: str, *, size: int, persistent: bool, producers: int, send_timeout_ms: int
    ) -> Options:
        """One destination, one consumer process."""
        return cls(
            destinations=(destination,),
            consumer_groups=((0,),),
            size=size,
            persistent=persistent,
            producers=producers,
            send_timeout_ms=send_timeout_ms,
        )

    @property
    def stall_s(self) -> float:
        """How long a producer waits for any answer before it calls the SEND unanswered."""
        return max(30.0, 3 * self.send_timeout_ms / 1000)

    @property
    def consumers(self) -> int:
        return len(self.consumer_groups)

    def destination_of(self, producer: int, seq: int) -> int:
        """The index in ``destinations`` of message ``seq`` of ``producer``: round robin,
        each producer starting at a destination of its own."""
        return (producer + seq) % len(self.destinations)

    def kind_of(self, destination: int) -> str:
        """``queue`` or ``topic`` (from the name's ``/queue/`` or ``/topic/`` prefix)."""
        return self.destinations[destination].split("/")[1]


@dataclass(frozen=True, slots=True)
class _Shared:
    """Handed to every process at spawn time."""

    start: Event
    stop_producers: Event
    stop_consumer: Event
    sent: Counters
    accepted: Counters
    refused: Counters
    #: This run's messages received so far, one slot per consumer process.
    received: Counters
    #: Per consumer process, the messages per second it acknowledges; negative: as fast as
    #: it can.
    rate: ctypes.Array[ctypes.c_double]
    results: multiprocessing.queues.Queue[_Report]

    @classmethod
    def create(cls, ctx: SpawnContext, producers: int, consumers: int) -> _Shared:
        rate = ctx.RawArray(ctypes.c_double, consumers)
        for i in range(consumers):
            rate[i] = -1.0
        return cls(
            start=ctx.Event(),
            stop_producers=ctx.Event(),
            stop_consumer=ctx.Event(),
            sent=ctx.RawArray(ctypes.c_longlong, producers),
            accepted=ctx.RawArray(ctypes.c_longlong, producers),
            refused=ctx.RawArray(ctypes.c_longlong, producers),
            received=ctx.RawArray(ctypes.c_longlong, consumers),
            rate=rate,
            results=ctx.Queue(),
        )


@dataclass(frozen=True, slots=True)
class _Ready:
    role: str
    index: int


@dataclass(frozen=True, slots=True)
class ProducerReport:
    index: int
    #: One status byte per sequence number (``_ACCEPTED`` ...).
    status: bytes = b""
    connections: int = 0
    longest_receipt_s: float = 0.0
    longest_refusal_s: float = 0.0
    #: RECEIPTs that took more than a second (the SEND was held by flow control).
    slow_receipts: int = 0
    #: ERROR messages of refused SENDs, with how often each came.
    refusals: tuple[tuple[str, int], ...] = ()
    #: Things that should not happen: a connection closed without an ERROR, an ERROR without
    #: receipt-id, no answer within the stall timeout.
    problems: tuple[str, ...] = ()
    failure: str = ""


@dataclass(frozen=True, slots=True)
class ConsumerReport:
    index: int = 0
    #: Per producer, how often each sequence number arrived (at most 255).
    counts: tuple[bytes, ...] = ()
    received: int = 0
    redelivered: int = 0
    #: Bodies that are not of this run.
    foreign: int = 0
    #: Messages of this run that came on a subscription other than their destination's
    #: (not in ``counts``).
    misrouted: int = 0
    failure: str = ""


_Report = _Ready | ProducerReport | ConsumerReport


# -- producer ---------------------------------------------------------------------------------


def _client_main(
    role: type[_Producer | _Consumer],
    index: int,
    options: Options,
    host: str,
    port: int,
    token: bytes,
    shared: _Shared,
) -> None:
    """Target of a producer or consumer process: run it, then put its report (with what
    failed, if anything) on the results queue."""
    client = role(index, options, host, port, token, shared)
    failure = ""
    try:
        client.run()
    except Exception as exc:
        failure = describe(exc)
    shared.results.put(client.report(failure))


class _Producer:
    def __init__(
        self, index: int, options: Options, host: str, port: int, token: bytes, shared: _Shared
    ) -> None:
        self.index = index
        self.options = options
        self.host = host
        self.port = port
        self.token = token
        self.shared = shared
        #: Per destination index, the headers of a SEND to it.
        self.headers: list[dict[str, str]] = []
        for destination in options.destinations:
            headers = {"destination": destination}
            if options.persistent:
                headers["persistent"] = "true"
            self.headers.append(headers)
        self.status = bytearray()
        self.seq = 0
        #: seq -> time.monotonic() of its send, in sequence order.
        self.outstanding: dict[int, float] = {}
        self.connections = 0
        self.accepted = 0
        self.refused = 0
        self.longest_receipt_s = 0.0
        self.longest_refusal_s = 0.0
        self.slow_receipts = 0
        self.refusals: collections.Counter[str] = collections.Counter()
        self.problems: list[str] = []

    def report(self, failure: str) -> ProducerReport:
        for seq in self.outstanding:
            self.status[seq] = _UNKNOWN
        return ProducerReport(
            self.index,
            status=bytes(self.status),
            connections=self.connections,
            longest_receipt_s=self.longest_receipt_s,
            longest_refusal_s=self.longest_refusal_s,
            slow_receipts=self.slow_receipts,
            refusals=tuple(self.refusals.most_common()),
            problems=tuple(self.problems),
            failure=failure,
        )

    def run(self) -> None:
        shared = self.shared
        conn = self._connection(STARTUP_TIMEOUT_S)
        conn.connect()
        shared.results.put(_Ready("producer", self.index))
        if not shared.start.wait(2 * STARTUP_TIMEOUT_S):
            raise TimeoutError("the coordinator never said start")
        failed_connects = 0
        while True:
            self.connections += 1
            self._session(conn)
            if shared.stop_producers.is_set():
                return
            try:
                conn = self._connection(self.options.stall_s)
                conn.connect()
                failed_connects = 0
            except (OSError, StompError, FrameTimeout, ProtocolError) as exc:
                failed_connects += 1
                self.problems.append(f"reconnect failed: {describe(exc)}")
                if failed_connects >= 5:
                    raise
                time.sleep(0.5)

    def _connection(self, timeout_s: float) -> RawClient:
        # The send timeout bounds a sendall the broker never reads.
        return RawClient(self.host, self.port, timeout_s, send_timeout=self.options.stall_s)

    def _session(self, conn: RawClient) -> None:
        """Send and settle answers until the connection ends, or until the producers stop
        and every SEND of this connection is answered."""
        stop = self.shared.stop_producers
        stall_s = self.options.stall_s
        first_seq = self.seq
        last_answer = time.monotonic()
        try:
            while True:
                stopping = stop.is_set()
                if stopping and not self.outstanding:
                    with contextlib.suppress(OSError, StompError, FrameTimeout):
                        conn.disconnect()
                    return
                free = WINDOW - len(self.outstanding)
                if not stopping and free > 0:
                    try:
                        self._send(conn, free)
                    except OSError as exc:
                        # Refused (the broker closed after an ERROR), or a sendall that
                        # the broker did not read for stall_s.
                        self._settle_after_close(conn, first_seq, f"send failed: {exc}")
                        return
                try:
                    frames = conn.read(_TICK_S * 5)
                except (OSError, ProtocolError) as exc:
                    self._settle_after_close(conn, first_seq, describe(exc))
                    return
                now = time.monotonic()
                if frames is None:
                    if self.outstanding and now - last_answer > stall_s:
                        self.problems.append(
                            f"no RECEIPT or ERROR for {stall_s:g} s with "
                            f"{len(self.outstanding)} SENDs outstanding"
                        )
                        self._settle_rest(None)
                        return
                    continue
                last_answer = now
                refused_at = self._take(frames, now)
                if refused_at is not None:
                    self._settle_after_close(conn, first_seq, "", refused_at)
                    return
        finally:
            conn.close()

    def _send(self, conn: RawClient, n: int) -> None:
        seq = self.seq
        headers = self.headers
        token = self.token
        index = self.index
        size = self.options.size
        destination_of = self.options.destination_of
        data = b"".join(
            encode_frame(
                Frame(
                    "SEND",
                    {**headers[destination_of(index, s)], "receipt": str(s)},
                    make_body(token, index, s, size),
                )
            )
            for s in range(seq, seq + n)
        )
        now = time.monotonic()
        for s in range(seq, seq + n):
            self.outstanding[s] = now
        self.status.extend(bytes(n))
        self.seq = seq + n
        self.shared.sent[index] = self.seq
        conn.send_bytes(data)

    def _take(self, frames: list[Frame], now: float) -> int | None:
        """Note RECEIPTs and ERRORs; the sequence number of a refused SEND, if one was."""
        refused_at: int | None = None
        for frame in frames:
            if frame.command == "RECEIPT":
                seq = int(frame.headers["receipt-id"])
                sent_at = self.outstanding.pop(seq, None)
                if sent_at is None:
                    self.problems.append(f"RECEIPT for {seq}, which was not outstanding")
                    continue
                self.status[seq] = _ACCEPTED
                self.accepted += 1
                waited = now - sent_at
                if waited > 1.0:
                    self.slow_receipts += 1
                self.longest_receipt_s = max(self.longest_receipt_s, waited)
            elif frame.command == "ERROR":
                message = frame.headers.get("message", "(no message header)")
                receipt = frame.headers.get("receipt-id")
                sent_at = self.outstanding.pop(int(receipt), None) if receipt else None
                if receipt is None or sent_at is None:
                    self.problems.append(f"ERROR without the receipt-id of a SEND: {message}")
                    # Whatever is outstanding has an unknown fate.
                    return -1
                seq = int(receipt)
                self.status[seq] = _REFUSED
                self.refused += 1
                self.shared.refused[self.index] = self.refused
                self.refusals[message] += 1
                self.longest_refusal_s = max(self.longest_refusal_s, now - sent_at)
                refused_at = seq
                break  # the broker closes the connection after an ERROR
        self.shared.accepted[self.index] = self.accepted
        return refused_at

    def _settle_after_close(
        self, conn: RawClient, first_seq: int, why: str, refused_at: int | None = None
    ) -> None:
        """The connection is ending: read what is left (RECEIPTs of SENDs before a refused
        one, the ERROR that explains a failed write), then settle what is still open."""
        deadline = time.monotonic() + self.options.stall_s
        while self.outstanding and time.monotonic() < deadline:
            try:
                frames = conn.read(max(0.0, deadline - time.monotonic()))
            except (OSError, ProtocolError):
                break
            if frames is None:
                break
            if refused_at is not None:
                # Only RECEIPTs may follow the ERROR; a second ERROR is a problem.
                frames_left = [f for f in frames if f.command != "ERROR"]
                if len(frames_left) != len(frames):
                    self.problems.append("a second ERROR on one connection")
                self._take(frames_left, time.monotonic())
            else:
                refused_at = self._take(frames, time.monotonic())
        if refused_at is None and (self.outstanding or not self.shared.stop_producers.is_set()):
            self.problems.append(
                f"connection closed without an ERROR ({why or 'end of stream'}) after "
                f"{self.seq - first_seq} SENDs, {len(self.outstanding)} unanswered"
            )
        self._settle_rest(refused_at)

    def _settle_rest(self, refused_at: int | None) -> None:
        """SENDs still unanswered: after a refused one they were never read (dropped);
        otherwise their fate is unknown."""
        for seq in self.outstanding:
            if refused_at is not None and refused_at >= 0 and seq > refused_at:
                self.status[seq] = _DROPPED
            else:
                self.status[seq] = _UNKNOWN
        self.outstanding.clear()


# -- consumer ---------------------------------------------------------------------------------


class _Consumer:
    """One connection subscribed to the destinations of its group; the subscription id of a
    destination is its index in ``Options.destinations``."""

    def __init__(
        self, index: int, options: Options, host: str, port: int, token: bytes, shared: _Shared
    ) -> None:
        self.index = index
        self.options = options
        self.host = host
        self.port = port
        self.prefix = body_prefix(token)
        self.shared = shared
        self.subscriptions = {str(d): d for d in options.consumer_groups[index]}
        self.counts = [bytearray() for _ in range(options.producers)]
        self.received = 0
        self.redelivered = 0
        self.foreign = 0
        self.misrouted = 0
        #: Ack ids of messages read and not yet acknowledged ("processed"), oldest first.
        self.pending: collections.deque[str] = collections.deque()

    def report(self, failure: str) -> ConsumerReport:
        return ConsumerReport(
            index=self.index,
            counts=tuple(bytes(c) for c in self.counts),
            received=self.received,
            redelivered=self.redelivered,
            foreign=self.foreign,
            misrouted=self.misrouted,
            failure=failure,
        )

    def run(self) -> None:
        shared = self.shared
        conn = RawClient(self.host, self.port, STARTUP_TIMEOUT_S, send_timeout=None)
        try:
            conn.connect()
            for sub_id, destination in self.subscriptions.items():
                conn.send(
                    "SUBSCRIBE",
                    {
                        "id": sub_id,
                        "destination": self.options.destinations[destination],
                        "ack": "client-individual",
                        "activemq.prefetchSize": str(PREFETCH),
                        "receipt": f"subscribed-{sub_id}",
                    },
                )
                conn.expect("RECEIPT", f"subscribed-{sub_id}")
            shared.results.put(_Ready("consumer", self.index))
            self._consume(conn)
            self._ack(conn, len(self.pending))
            conn.disconnect()
        finally:
            conn.close()

    def _consume(self, conn: RawClient) -> None:
        stop = self.shared.stop_consumer
        rate_slot = self.shared.rate
        me = self.index
        credit = 0.0
        last = time.monotonic()
        while not stop.is_set():
            rate = rate_slot[me]
            timeout = _TICK_S
            if self.pending and rate > 0:
                timeout = min(_TICK_S, max(0.0005, (1.0 - credit) / rate))
            frames = conn.read(timeout)
            if frames is not None:
                self._tally(frames)
            now = time.monotonic()
            if rate < 0:
                n = len(self.pending)
                credit = 0.0
            else:
                credit += (now - last) * rate
                n = min(int(credit), len(self.pending))
                credit -= n
                if not self.pending or n == len(self.pending):
                    # Starved, not slow: credit must not pile up into a burst later.
                    credit = min(credit, 1.0)
            last = now
            if n:
                self._ack(conn, n)

    def _tally(self, frames: list[Frame]) -> None:
        prefix = self.prefix
        head = len(prefix)
        subscriptions = self.subscriptions
        destination_of = self.options.destination_of
        for frame in frames:
            if frame.command == "MESSAGE":
                headers = frame.headers
                self.pending.append(headers["ack"])
                if headers.get("redelivered") == "true":
                    self.redelivered += 1
                body = frame.body
                if not body.startswith(prefix):
                    self.foreign += 1
                    continue
                producer = int(body[head : head + 5])
                seq = int(body[head + 6 : head + 16])
                if not 0 <= producer < len(self.counts):
                    self.foreign += 1
                    continue
                self.received += 1
                if subscriptions.get(headers.get("subscription", "")) != destination_of(
                    producer, seq
                ):
                    self.misrouted += 1
                    continue
                counts = self.counts[producer]
                if seq >= len(counts):
                    counts.extend(bytes(seq + 1 - len(counts) + 65536))
                if counts[seq] < 255:
                    counts[seq] += 1
            elif frame.command == "ERROR":
                raise StompError(frame)
        self.shared.received[self.index] = self.received

    def _ack(self, conn: RawClient, n: int) -> None:
        pending = self.pending
        if n:
            acks = (encode_frame(Frame("ACK", {"id": pending.popleft()})) for _ in range(n))
            send_explained(conn, b"".join(acks))


# -- reconciliation ---------------------------------------------------------------------------


@dataclass(slots=True)
class Reconciliation:
    """The fate of the messages sent to destinations of one kind, and what arrived of them."""

    sent: int = 0
    accepted: int = 0
    refused: int = 0
    #: Sent after a refused SEND on the same connection (never read by the broker).
    dropped: int = 0
    #: The connection broke without an answer (should be 0).
    unknown: int = 0
    #: Accepted, never received.
    lost: int = 0
    #: Extra deliveries of accepted messages.
    duplicates: int = 0
    #: Deliveries of refused or dropped messages, or of sequence numbers never sent.
    delivered_not_accepted: int = 0
    #: Deliveries of messages of unknown fate.
    unknown_delivered: int = 0

    @property
    def lossless(self) -> bool:
        return not (self.lost or self.duplicates or self.delivered_not_accepted or self.unknown)

    def add(self, other: Reconciliation) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def reconcile(
    options: Options,
    producers: list[ProducerReport],
    consumers: list[ConsumerReport],
) -> dict[str, Reconciliation]:
    """Every message of every producer against what the consumers counted, by the kind of
    its destination (``queue``, ``topic``). Each destination has one subscription, so an
    accepted message must have arrived exactly once."""
    n = len(options.destinations)
    result = {options.kind_of(d): Reconciliation() for d in range(n)}
    # The consumer report that holds the counts of each destination.
    owner: dict[int, ConsumerReport] = {}
    for consumer in consumers:
        for d in options.consumer_groups[consumer.index]:
            owner[d] = consumer
    for report in producers:
        p = report.index
        for d in range(n):
            tally = result[options.kind_of(d)]
            counts = owner[d].counts[p] if d in owner and p < len(owner[d].counts) else b""
            # The messages of producer p to destination d: every n-th from the first one
            # (Options.destination_of); slices keep this at C speed for millions of them.
            first = (d - p) % n
            status = report.status[first::n]
            got = counts[first::n]
            got, beyond = got[: len(status)], got[len(status) :]
            got += bytes(len(status) - len(got))
            accepted = status.count(_ACCEPTED)
            refused = status.count(_REFUSED)
            dropped = status.count(_DROPPED)
            tally.sent += len(status)
            tally.accepted += accepted
            tally.refused += refused
            tally.dropped += dropped
            tally.unknown += len(status) - accepted - refused - dropped
            # Anything that arrived with a sequence number that was never sent.
            tally.delivered_not_accepted += sum(beyond)
            if got == status.translate(_EXACTLY_ONCE):
                continue  # each accepted message once, nothing else
            for state, received in zip(status, got, strict=True):
                if state == _ACCEPTED:
                    if received == 0:
                        tally.lost += 1
                    elif received > 1:
                        tally.duplicates += received - 1
                elif received:
                    if state in (_REFUSED, _DROPPED):
                        tally.delivered_not_accepted += received
                    else:
                        tally.unknown_delivered += received
    return result


# -- broker observation -----------------------------------------------------------------------


class BrokerLog:
    """Counts what the broker's log says about flow control and refusals (fed line by line
    from the thread that drains its stderr). A subclass may look for more lines in
    :meth:`feed_more`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stops: collections.Counter[str] = collections.Counter()  # by "what: reason"
        self.starts = 0
        self.refused_sends = 0
        self.stopped_since: dict[str, float] = {}
        self.longest_stop_s = 0.0
        self.other_warnings = 0
        self.first_warnings: list[str] = []

    def feed(self, line: str) -> None:
        line = line.rstrip("\n")
        now = time.monotonic()
        with self.lock:
            if match := _FLOW_STOP.search(line):
                self.stops[f"{match.group(1)}: {match.group(2)}"] += 1
                self.stopped_since.setdefault(match.group(1), now)
            elif match := _FLOW_GO.search(line):
                self.starts += 1
                since = self.stopped_since.pop(match.group(1), None)
                if since is not None:
                    self.longest_stop_s = max(self.longest_stop_s, now - since)
            elif _REFUSED_SEND in line:
                self.refused_sends += 1
            elif more := _REFUSED_SENDS_MORE.search(line):
                self.refused_sends += int(more.group(1).replace(",", ""))
            elif self.feed_more(line, now):
                pass
            elif _LOG_LEVEL.search(line):
                self.other_warnings += 1
                if len(self.first_warnings) < 5:
                    self.first_warnings.append(line)

    def feed_more(self, line: str, now: float) -> bool:
        """A subclass's lines (called with the lock held); True if ``line`` was one."""
        return False

    def snapshot(self) -> tuple[int, int]:
        with self.lock:
            return sum(self.stops.values()), self.starts

    def still_stopped_s(self) -> float:
        """How long the longest stop still in force has lasted."""
        now = time.monotonic()
        with self.lock:
            return max((now - since for since in self.stopped_since.values()), default=0.0)

    def summary(self) -> dict[str, Any]:
        with self.lock:
            return {
                "flow_stops": sum(self.stops.values()),
                "flow_starts": self.starts,
                "flow_stops_by_limit": dict(self.stops),
                "longest_flow_stop_s": round(self.longest_stop_s, 2),
                "refused_sends_logged": self.refused_sends,
                "other_warnings": self.other_warnings,
                "first_warnings": list(self.first_warnings),
            }


def _role(process: psutil.Process) -> str:
    """``gateway 0`` for ``mpbroker: gateway 0`` (the broker titles its processes)."""
    try:
        title = " ".join(process.cmdline()).strip()
        if title.startswith("mpbroker:"):
            return title.removeprefix("mpbroker:").strip()
        if "resource_tracker" in title:
            return "resource_tracker"  # multiprocessing's, for the shared memory
        return f"{process.name()} {process.pid}"
    except psutil.Error:
        return f"pid {process.pid}"


class MemorySampler(threading.Thread):
    """Every second: the summed PSS (RSS where PSS cannot be read) of the broker's processes."""

    def __init__(self, pid: int) -> None:
        super().__init__(name="soak-memory", daemon=True)
        self.root = psutil.Process(pid)
        self.finish = threading.Event()
        self.lock = threading.Lock()
        self.kind = "PSS"
        self.samples: list[tuple[float, int]] = []
        self.peak = 0
        self.peak_at = 0.0
        self.peak_parts: dict[str, int] = {}
        #: The highest sum of the processes' RSS: counts shared pages once per process.
        self.peak_rss = 0
        self.processes = 0

    def sample(self) -> tuple[int, dict[str, int]]:
        """The summed PSS now, and its parts by process; also tracks the peak summed RSS."""
        parts: dict[str, int] = {}
        rss = 0
        try:
            processes = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return 0, parts
        for process in processes:
            try:
                value, resident, proportional = process_memory(process)
            except psutil.Error:
                continue  # exited meanwhile
            if not proportional:
                self.kind = "RSS"
            rss += resident
            role = _role(process)
            parts[role] = parts.get(role, 0) + value
        with self.lock:
            self.peak_rss = max(self.peak_rss, rss)
        return sum(parts.values()), parts

    def run(self) -> None:
        while not self.finish.is_set():
            total, parts = self.sample()
            now = time.monotonic()
            with self.lock:
                self.samples.append((now, total))
                self.processes = max(self.processes, len(parts))
                if total > self.peak:
                    self.peak, self.peak_at, self.peak_parts = total, now, parts
            self.finish.wait(_SAMPLE_S)

    def latest(self) -> int:
        with self.lock:
            return self.samples[-1][1] if self.samples else 0

    def peak_between(self, start: float, end: float) -> int:
        with self.lock:
            return max((v for t, v in self.samples if start <= t <= end), default=0)


# -- coordinator ------------------------------------------------------------------------------


def mib(n: int) -> float:
    return n / 2**20


@dataclass(frozen=True, slots=True)
class Phases:
    """What the coordinator measured along the way, for a summary (times: time.monotonic())."""

    #: Summed PSS (or RSS) of the broker before the producers started.
    idle: int
    #: When the producers were told to start.
    started: float
    #: Accepted messages per second during calibration (consumers at full speed).
    calibrated: float
    #: Messages per second all consumers together acknowledged during the soak.
    consumer_rate: float
    soak: tuple[float, float]
    drain: tuple[float, float]
    #: Messages received during the drain.
    drained: int
    #: Counts over the soak phase: sent, accepted, refused, received, stops, starts.
    soak_counts: dict[str, int]
    soak_end_pss: int
    after_drain_pss: int
    #: How long the longest flow stop still in force at the soak's end had lasted.
    stopped_at_end_s: float


class SoakRun:
    """The coordinator: starts the broker, the consumers (which subscribe) and then the
    producers; calibrates, soaks, stops the producers, drains and reconciles.

    Subclasses change :meth:`start_broker`, :meth:`on_started` (the producers were just told
    to start), :meth:`progress_line`, :meth:`summarize` and :meth:`close` (always called at
    the end, before the broker stops).
    """

    #: Prefix of progress lines and the names of the processes.
    name = "soak"

    def __init__(
        self,
        options: Options,
        minutes: float,
        calibrate_s: float,
        *,
        consumer_share: float = CONSUMER_SHARE,
        log: BrokerLog | None = None,
    ) -> None:
        self.options = options
        self.minutes = minutes
        self.calibrate_s = calibrate_s
        self.consumer_share = consumer_share
        self.ctx: SpawnContext = multiprocessing.get_context("spawn")
        self.processes: list[BaseProcess] = []
        self.producer_reports: dict[int, ProducerReport] = {}
        self.consumer_reports: dict[int, ConsumerReport] = {}
        self.failures: list[str] = []
        self.shared = _Shared.create(self.ctx, options.producers, options.consumers)
        self.token = secrets.token_hex(4).encode()
        self.log = log if log is not None else BrokerLog()

    # -- hooks ----------------------------------------------------------------------------

    def start_broker(self) -> BrokerProcess:
        """A started broker whose stderr lines go to ``self.log.feed``."""
        options = self.options
        config = soak_config(
            send_timeout_ms=options.send_timeout_ms, destination=options.destinations[0]
        )
        return BrokerProcess(config=config, admin=False, on_line=self.log.feed).start()

    def on_started(self, server: BrokerProcess, started: float) -> None:
        """The producers were just told to start (at ``started``)."""

    def progress_line(self, elapsed: float, sampler: MemorySampler) -> str:
        shared = self.shared
        accepted = self.accepted()
        received = self.received()
        stops, starts = self.log.snapshot()
        return (
            f"{elapsed / 60:4.1f} min: accepted {accepted:,}, refused {sum(shared.refused):,},"
            f" received {received:,}, backlog {accepted - received:,};"
            f" broker {sampler.kind} {mib(sampler.latest()):.1f} MiB"
            f" (peak {mib(sampler.peak):.1f}); flow stops {stops}, starts {starts}"
        )

    def summarize(self, phases: Phases, sampler: MemorySampler) -> dict[str, Any]:
        """The summary of ``python -m bench.soak`` (see :func:`format_summary`)."""
        options = self.options
        messages = self.message_summary()
        soak_s = phases.soak[1] - phases.soak[0]
        half = (phases.soak[0] + phases.soak[1]) / 2
        counts = phases.soak_counts
        summary: dict[str, Any] = {
            "command": {
                "minutes": self.minutes,
                "producers": options.producers,
                "size": options.size,
                "persistent": options.persistent,
                "send_timeout_ms": options.send_timeout_ms,
                "destination": options.destinations[0],
                "msg_high": MSG_HIGH,
                "msg_low": MSG_LOW,
            },
            **self.phase_summary(phases),
            "soak_sent_rate": round(counts["sent"] / soak_s),
            "soak_accepted_rate": round(counts["accepted"] / soak_s),
            "soak_refused": counts["refused"],
            "soak_consumer_rate": round(counts["received"] / soak_s),
            "soak_flow_stops": counts["stops"],
            "soak_flow_starts": counts["starts"],
            "stopped_at_soak_end_s": round(phases.stopped_at_end_s, 2),
            **messages,
            **self.memory_summary(phases, sampler),
            "peak_first_half_mib": round(mib(sampler.peak_between(phases.soak[0], half)), 1),
            "peak_second_half_mib": round(mib(sampler.peak_between(half, phases.soak[1])), 1),
            **self.log.summary(),
        }
        summary["ok"] = messages["lossless"] and not self.failures
        return summary

    def close(self) -> None:
        """Always called at the end of :meth:`run`, before the broker stops."""

    # -- pieces of a summary --------------------------------------------------------------

    def accepted(self) -> int:
        return sum(self.shared.accepted)

    def received(self) -> int:
        return sum(self.shared.received)

    def reconciliation(self) -> dict[str, Reconciliation]:
        return reconcile(
            self.options,
            [self.producer_reports[i] for i in sorted(self.producer_reports)],
            [self.consumer_reports[i] for i in sorted(self.consumer_reports)],
        )

    def message_summary(self) -> dict[str, Any]:
        """What happened to the messages, over all destinations; ``lossless`` says whether
        every accepted message arrived exactly once and nothing else did."""
        reports = [self.producer_reports[i] for i in sorted(self.producer_reports)]
        consumers = list(self.consumer_reports.values())
        total = Reconciliation()
        for part in self.reconciliation().values():
            total.add(part)
        refusals: collections.Counter[str] = collections.Counter()
        for report in reports:
            refusals.update(dict(report.refusals))
        foreign = sum(c.foreign for c in consumers)
        misrouted = sum(c.misrouted for c in consumers)
        return {
            "sent": total.sent,
            "accepted": total.accepted,
            "refused": total.refused,
            "dropped": total.dropped,
            "unknown": total.unknown,
            "received": sum(c.received for c in consumers),
            "redelivered": sum(c.redelivered for c in consumers),
            "foreign": foreign,
            "misrouted": misrouted,
            "lost": total.lost,
            "duplicates": total.duplicates,
            "delivered_not_accepted": total.delivered_not_accepted,
            "unknown_delivered": total.unknown_delivered,
            "lossless": total.lossless and not foreign and not misrouted,
            "connections": sum(r.connections for r in reports),
            "refusal_messages": dict(refusals.most_common(5)),
            "longest_receipt_s": round(max((r.longest_receipt_s for r in reports), default=0), 3),
            "longest_refusal_s": round(max((r.longest_refusal_s for r in reports), default=0), 3),
            "slow_receipts": sum(r.slow_receipts for r in reports),
            "producer_problems": [p for r in reports for p in r.problems][:10],
            "producer_problem_count": sum(len(r.problems) for r in reports),
        }

    def phase_summary(self, phases: Phases) -> dict[str, Any]:
        drain_s = phases.drain[1] - phases.drain[0]
        return {
            "duration_s": round(phases.drain[1] - phases.started, 1),
            "soak_s": round(phases.soak[1] - phases.soak[0], 1),
            "calibrated_rate": round(phases.calibrated),
            "consumer_target_rate": round(phases.consumer_rate),
            "drain_s": round(drain_s, 1),
            "drained": phases.drained,
            "drain_rate": round(phases.drained / drain_s) if drain_s > 0 else 0,
        }

    def memory_summary(self, phases: Phases, sampler: MemorySampler) -> dict[str, Any]:
        return {
            "memory_kind": sampler.kind,
            "broker_processes": sampler.processes,
            "idle_mib": round(mib(phases.idle), 1),
            "peak_mib": round(mib(sampler.peak), 1),
            "peak_at_s": round(sampler.peak_at - phases.started, 1),
            "peak_rss_sum_mib": round(mib(sampler.peak_rss), 1),
            "peak_parts_mib": {k: round(mib(v), 1) for k, v in sorted(sampler.peak_parts.items())},
            "soak_end_mib": round(mib(phases.soak_end_pss), 1),
            "after_drain_mib": round(mib(phases.after_drain_pss), 1),
        }

    # -- running --------------------------------------------------------------------------

    def say(self, text: str) -> None:
        print(f"{self.name}: {text}", file=sys.stderr, flush=True)

    def _wait_for(self, want: int, what: str, timeout_s: float) -> None:
        """Collect reports until ``want`` of kind ``what`` arrived."""
        deadline = time.monotonic() + timeout_s
        got = 0
        while got < want:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"only {got} of {want} {what} within {timeout_s:g} s")
            try:
                report = self.shared.results.get(timeout=min(left, 1.0))
            except queue.Empty:
                if not any(p.is_alive() for p in self.processes):
                    raise RuntimeError(
                        f"every process exited; only {got} of {want} {what}"
                    ) from None
                continue
            if isinstance(report, ProducerReport):
                self.producer_reports[report.index] = report
                if report.failure:
                    self.failures.append(f"producer {report.index}: {report.failure}")
                if what == "producer reports":
                    got += 1
                else:
                    raise RuntimeError(f"producer {report.index} ended early: {report.failure}")
            elif isinstance(report, ConsumerReport):
                self.consumer_reports[report.index] = report
                single = self.options.consumers == 1
                if report.failure:
                    who = "consumer" if single else f"consumer {report.index}"
                    self.failures.append(f"{who}: {report.failure}")
                if what == "consumer reports":
                    got += 1
                else:
                    who = "the consumer" if single else f"consumer {report.index}"
                    raise RuntimeError(f"{who} ended early: {report.failure}")
            elif what == "ready notices":
                got += 1

    def run(self) -> dict[str, Any]:
        server = self.start_broker()
        self.say(f"broker (pid {server.pid}) ready on {server.host}:{server.port}")
        sampler: MemorySampler | None = None
        try:
            sampler = MemorySampler(server.pid)
            phases = self._run(server, sampler)
            summary = self.summarize(phases, sampler)
        finally:
            if sampler is not None:
                sampler.finish.set()
            self.close()
            self.shared.stop_producers.set()
            self.shared.stop_consumer.set()
            for process in self.processes:
                process.join(5)
                if process.is_alive():
                    process.terminate()
                    process.join(5)
            try:
                server.stop_checked()
            except ServerError as exc:
                self.failures.append(str(exc))
        summary["failures"] = self.failures
        if self.failures:
            summary["ok"] = False
        return summary

    def _run(self, server: BrokerProcess, sampler: MemorySampler) -> Phases:
        options = self.options
        shared = self.shared
        args = (options, server.host, server.port, self.token, shared)
        consumers: list[BaseProcess] = []
        for index in range(options.consumers):
            suffix = "" if options.consumers == 1 else f"-{index}"
            process = self.ctx.Process(
                target=_client_main,
                args=(_Consumer, index, *args),
                name=f"{self.name}-consumer{suffix}",
            )
            process.start()
            consumers.append(process)
            self.processes.append(process)
        self._wait_for(options.consumers, "ready notices", STARTUP_TIMEOUT_S)
        for index in range(options.producers):
            process = self.ctx.Process(
                target=_client_main,
                args=(_Producer, index, *args),
                name=f"{self.name}-producer-{index}",
            )
            process.start()
            self.processes.append(process)
        self._wait_for(options.producers, "ready notices", STARTUP_TIMEOUT_S)

        idle, _ = sampler.sample()
        sampler.start()
        started = time.monotonic()
        shared.start.set()
        self.on_started(server, started)
        self.say(
            f"{options.producers} producers at full speed; calibrating for {self.calibrate_s:g} s"
            f" with the consumer{'s' if options.consumers > 1 else ''} at full speed"
        )
        # Calibration: the rate from the first second on (connections warm, processes up).
        first = min(1.0, self.calibrate_s / 3)
        time.sleep(first)
        at_first = self.accepted()
        time.sleep(self.calibrate_s - first)
        calibrated = (self.accepted() - at_first) / (self.calibrate_s - first)
        consumer_rate = max(1.0, calibrated * self.consumer_share)
        # Each consumer takes its destinations' share: producers send to all alike.
        for index, group in enumerate(options.consumer_groups):
            shared.rate[index] = consumer_rate * len(group) / len(options.destinations)
        soak_start = time.monotonic()
        accepted_at_start = self.accepted()
        received_at_start = self.received()
        sent_at_start = sum(shared.sent)
        refused_at_start = sum(shared.refused)
        stops_at_start, starts_at_start = self.log.snapshot()
        self.say(
            f"producers reached {calibrated:,.0f} msgs/s; the consumer"
            f"{'s' if options.consumers > 1 else ''} now take{'' if options.consumers > 1 else 's'}"
            f" {consumer_rate:,.0f}/s for {self.minutes:g} min"
        )

        soak_s = self.minutes * 60
        next_progress = soak_start + _PROGRESS_S
        while (now := time.monotonic()) < soak_start + soak_s:
            if not all(p.is_alive() for p in self.processes):
                self.failures.append("a producer or the consumer exited during the soak")
                break
            if now >= next_progress:
                next_progress += _PROGRESS_S
                self.say(self.progress_line(now - soak_start, sampler))
            time.sleep(min(0.2, soak_start + soak_s - now))
        soak_end = time.monotonic()
        soak_end_pss = sampler.latest()
        accepted_at_end = self.accepted()
        received_at_end = self.received()
        sent_at_end = sum(shared.sent)
        refused_at_end = sum(shared.refused)
        stops_at_end, starts_at_end = self.log.snapshot()
        stopped_at_end_s = self.log.still_stopped_s()

        # The end: producers settle what is in flight and report; then the consumers drain.
        shared.stop_producers.set()
        self._wait_for(
            options.producers, "producer reports", 2 * options.stall_s + STARTUP_TIMEOUT_S
        )
        accepted = sum(r.status.count(_ACCEPTED) for r in self.producer_reports.values())
        self.say(f"producers stopped; draining {accepted - self.received():,} messages")
        for index in range(options.consumers):
            shared.rate[index] = -1.0
        drain_start = time.monotonic()
        received_at_drain = self.received()
        last_count, last_change = received_at_drain, drain_start
        while self.received() < accepted:
            time.sleep(0.05)
            now = time.monotonic()
            if self.received() != last_count:
                last_count, last_change = self.received(), now
            elif now - last_change > _DRAIN_STALL_S:
                self.say(f"nothing arrived for {_DRAIN_STALL_S:g} s; giving up the drain")
                break
            if not all(c.is_alive() for c in consumers):
                break
        drain_end = time.monotonic()
        time.sleep(_DUPLICATE_GRACE_S)
        shared.stop_consumer.set()
        self._wait_for(options.consumers, "consumer reports", STARTUP_TIMEOUT_S)
        sampler.finish.set()
        sampler.join(5)
        after_drain_pss = sampler.sample()[0]
        return Phases(
            idle=idle,
            started=started,
            calibrated=calibrated,
            consumer_rate=consumer_rate,
            soak=(soak_start, soak_end),
            drain=(drain_start, drain_end),
            drained=self.received() - received_at_drain,
            soak_counts={
                "sent": sent_at_end - sent_at_start,
                "accepted": accepted_at_end - accepted_at_start,
                "refused": refused_at_end - refused_at_start,
                "received": received_at_end - received_at_start,
                "stops": stops_at_end - stops_at_start,
                "starts": starts_at_end - starts_at_start,
            },
            soak_end_pss=soak_end_pss,
            after_drain_pss=after_drain_pss,
            stopped_at_end_s=stopped_at_end_s,
        )


def producer_lines(s: dict[str, Any]) -> list[str]:
    """The part of a summary both soaks print: stops by limit, waits, refusals, the broker
    log's warnings, producer problems, failures."""
    lines = [
        f"  stops by limit: {s['flow_stops_by_limit']}",
        f"producers waited at most {s['longest_receipt_s']:g} s for a RECEIPT"
        f" ({s['slow_receipts']:,} took over 1 s), {s['longest_refusal_s']:g} s for an ERROR;"
        f" {s['connections']} connections",
    ]
    if s["refusal_messages"]:
        lines.append(f"  refusals: {s['refusal_messages']}")
    lines.append(
        f"broker log: {s['refused_sends_logged']:,} refused SENDs, {s['other_warnings']} other"
        " warnings or errors"
    )
    lines += [f"  {w}" for w in s["first_warnings"]]
    if s["producer_problem_count"]:
        lines.append(f"producer problems ({s['producer_problem_count']}):")
        lines += [f"  {p}" for p in s["producer_problems"]]
    lines += [f"FAILURE: {f}" for f in s["failures"]]
    return lines


def format_summary(s: dict[str, Any]) -> str:
    """The summary as text."""
    c = s["command"]
    kind = s["memory_kind"]
    lines = [
        f"slow-consumer soak: {c['producers']} producers, {c['size']}-byte"
        f" {'persistent' if c['persistent'] else 'non-persistent'} messages to"
        f" {c['destination']} (msg_high {c['msg_high']}, msg_low {c['msg_low']},"
        f" send_timeout_ms {c['send_timeout_ms']})",
        f"duration: {s['duration_s']:g} s (soak {s['soak_s']:g} s, drain {s['drain_s']:g} s)",
        f"producers: {s['calibrated_rate']:,} msgs/s accepted at full speed (calibration);"
        f" during the soak {s['soak_sent_rate']:,}/s sent, {s['soak_accepted_rate']:,}/s"
        f" accepted, {s['soak_refused']:,} refused",
        f"consumer: {s['consumer_target_rate']:,} msgs/s target, {s['soak_consumer_rate']:,}/s"
        f" during the soak; drained the last {s['drained']:,} at {s['drain_rate']:,}/s",
        f"messages: sent {s['sent']:,} = accepted {s['accepted']:,} + refused {s['refused']:,}"
        f" + dropped behind a refusal {s['dropped']:,} + unknown {s['unknown']:,};"
        f" received {s['received']:,}",
        f"lost: {s['lost']:,}; duplicates: {s['duplicates']:,}; delivered without being"
        f" accepted: {s['delivered_not_accepted']:,}; redelivered: {s['redelivered']:,}",
        f"broker memory ({kind}, {s['broker_processes']} processes): idle {s['idle_mib']} MiB,"
        f" peak {s['peak_mib']} MiB at {s['peak_at_s']:g} s"
        f" (x{s['peak_mib'] / max(s['idle_mib'], 0.1):.2f}); peak in the soak's first half"
        f" {s['peak_first_half_mib']} MiB, second half {s['peak_second_half_mib']} MiB;"
        f" at its end {s['soak_end_mib']} MiB, after the drain {s['after_drain_mib']} MiB;"
        f" peak of the summed RSS {s['peak_rss_sum_mib']} MiB",
        "  at the peak: "
        + ", ".join(f"{role} {size}" for role, size in s["peak_parts_mib"].items()),
        f"flow control: {s['flow_stops']} stops, {s['flow_starts']} starts"
        f" ({s['soak_flow_stops']} / {s['soak_flow_starts']} during the soak);"
        f" longest stop {s['longest_flow_stop_s']:g} s",
    ]
    lines += producer_lines(s)
    lines.append("ok: nothing lost" if s["ok"] else "FAILED")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description="Slow-consumer soak: producers at full speed, one consumer at 10 %% of"
        " their rate; reports broker memory, flow stops/starts and that nothing was lost.",
    )
    parser.add_argument("--minutes", type=float, default=5.0, help="soak length (default 5)")
    parser.add_argument("--producers", type=int, default=2, help="producer processes (default 2)")
    parser.add_argument("--size", type=int, default=1000, help="body bytes (default 1000)")
    parser.add_argument("--persistent", action="store_true", help="send with persistent:true")
    parser.add_argument(
        "--send-timeout-ms",
        type=int,
        default=2000,
        help="flow.send_timeout_ms of the broker (default 2000)",
    )
    parser.add_argument("--destination", default="/queue/soak", help="default /queue/soak")
    args = parse_soak_args(parser, argv)
    if args.size < BODY_HEADER_BYTES:
        parser.error(f"--size must be at least {BODY_HEADER_BYTES}")
    if not args.destination.startswith("/queue/"):
        parser.error("--destination must be a /queue/NAME")
    if args.send_timeout_ms < 0:
        parser.error("--send-timeout-ms must not be negative")
    options = Options.single(
        args.destination,
        size=args.size,
        persistent=args.persistent,
        producers=args.producers,
        send_timeout_ms=args.send_timeout_ms,
    )
    run = SoakRun(options, args.minutes, args.calibrate_seconds)
    return run_and_report(run, format_summary if not args.json else None)


def parse_soak_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The options both soaks share (after each one's own: --minutes, --producers),
    parsed and checked."""
    parser.add_argument(
        "--calibrate-seconds",
        type=float,
        default=5.0,
        help="full-speed phase that measures the producers' rate (default 5)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.producers < 1 or args.calibrate_seconds < 1:
        parser.error("--minutes must be positive, --producers and --calibrate-seconds >= 1")
    return args


def run_and_report(run: SoakRun, text: Callable[[dict[str, Any]], str] | None) -> int:
    """Run a soak and print its summary (`text`, or JSON when None); the exit status: 0
    when it is ok, 1 when it failed or was aborted."""
    try:
        summary = run.run()
    except (ServerError, TimeoutError, RuntimeError) as exc:
        run.say(f"aborted: {describe(exc)}")
        for failure in run.failures:
            run.say(failure)
        return 1
    print(json.dumps(summary) if text is None else text(summary), flush=True)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
