"""A producer process: SEND frames in big batches, a RECEIPT every so often.

One ``sendall`` carries about :data:`BATCH_BYTES` of frames. Every ``receipt_every``-th
message (and the last one) asks for a RECEIPT; at most ``max_in_flight`` of those may be
outstanding, and the producer also pauses while it is ``max_backlog`` messages ahead of the
consumers, so it measures the broker's steady state instead of filling its queues until they
refuse messages.

:class:`PacedProducer` is that send loop without the backlog rule; the selector study's
publisher (:mod:`mpbroker.loadgen.filterproc`) paces it by the delivery rate instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from mpbroker.harness import RawClient, StompError

from .control import STARTUP_TIMEOUT_S, Control, ProducerResult, Ready, describe
from .scenario import Scenario
from .wire import SendTemplate, StampedTemplate, send_explained

__all__ = ["BATCH_BYTES", "PacedProducer", "producer_main", "run_producer"]

#: Bytes of SEND frames written with one system call.
BATCH_BYTES = 64 * 1024
# How long a producer sleeps while the backlog is full: short against the time consumers take
# to drain a batch, long enough not to steal a core from the broker by spinning.
_BACKLOG_POLL_S = 0.0005


class Aborted(Exception):
    """The coordinator stopped the run while this producer was still sending."""


def producer_main(
    index: int, scenario: Scenario, host: str, port: int, token: bytes, control: Control
) -> None:
    """Process entry point: run, then report a :class:`ProducerResult` (with any error)."""
    run_producer(index, control, lambda: _Producer(index, scenario, host, port, token, control))


def run_producer(index: int, control: Control, make: Callable[[], PacedProducer]) -> None:
    """Run the producer ``make`` builds and put its :class:`ProducerResult` on
    ``control.results``; one that failed (also while being built) reports how many messages
    it sent and the error."""
    result: ProducerResult
    try:
        result = make().run()
    except Exception as exc:
        result = ProducerResult(index, sent=control.sent[index], error=describe(exc))
    control.results.put(result)


class PacedProducer:
    """A producer process's connection and send loop, which the bench's producers and the
    selector study's publisher share.

    It connects, reports :class:`Ready`, waits for the start and sends messages ``0 ..
    count-1`` of ``template``: up to :data:`BATCH_BYTES` (and at most ``max_batch``
    messages) per write, every ``receipt_every``-th message and the last asking for a
    RECEIPT, at most ``max_in_flight`` of those outstanding. Subclasses pace it: before each
    write :meth:`_pace` waits for the consumers and may shorten it, and :meth:`_stop_early`
    may end the run before ``count``.
    """

    def __init__(
        self,
        index: int,
        conn: RawClient,
        template: StampedTemplate,
        control: Control,
        *,
        count: int,
        receipt_every: int,
        max_in_flight: int,
        stall_timeout_s: float,
        max_batch: int | None = None,
    ) -> None:
        self.index = index
        self.conn = conn
        self.template = template
        self.control = control
        self.count = count
        self.receipt_every = receipt_every
        self.max_in_flight = max_in_flight
        self.stall_timeout_s = stall_timeout_s
        per_write = BATCH_BYTES // template.frame_bytes
        self.batch = max(1, per_write if max_batch is None else min(per_write, max_batch))
        self.outstanding = 0
        #: time.monotonic() just before the first send.
        self.first_send = 0.0

    def _pace(self, seq: int, stop: int) -> int:
        """Called before writing messages ``seq .. stop-1``: wait while the consumers are too
        far behind; returns where this write stops (``stop`` or sooner)."""
        return stop

    def _stop_early(self, seq: int) -> bool:
        """Whether to stop with ``seq`` messages sent, before ``count``."""
        return False

    def run(self) -> ProducerResult:
        control = self.control
        conn = self.conn
        template = self.template
        stall_timeout_s = self.stall_timeout_s
        try:
            conn.connect()
            control.results.put(Ready("producer", self.index))
            # The coordinator starts producers once all processes are connected.
            if not control.start.wait(max(stall_timeout_s, 2 * STARTUP_TIMEOUT_S)):
                raise TimeoutError("the coordinator never said start")
            count = self.count
            every = self.receipt_every
            batch = self.batch
            sent = control.sent
            seq = 0
            self.first_send = first_send = time.monotonic()
            cpu_start = time.process_time()
            while seq < count and not self._stop_early(seq):
                window_end = min((seq // every + 1) * every, count)
                stop = self._pace(seq, min(seq + batch, window_end))
                if stop == window_end:
                    while self.outstanding >= self.max_in_flight:
                        self._take_receipts(stall_timeout_s, "RECEIPT")
                    last = stop - 1
                    data = template.frames(seq, last) + template.frame_with_receipt(last, str(last))
                    self.outstanding += 1
                else:
                    data = template.frames(seq, stop)
                send_explained(conn, data)
                seq = stop
                sent[self.index] = seq
                if self.outstanding:
                    self._take_receipts(0.0, "")
            while self.outstanding:
                self._take_receipts(stall_timeout_s, "RECEIPT")
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

    def _poll(self) -> None:
        """The pause of a producer waiting for its consumers: takes what the server sends
        for up to a short while."""
        self._take_receipts(_BACKLOG_POLL_S, "")

    def _take_receipts(self, timeout_s: float, waiting_for: str) -> None:
        """Read what the server sent (RECEIPTs, maybe an ERROR) within ``timeout_s``."""
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


class _Producer(PacedProducer):
    """A producer of the bench: paused while ``max_backlog`` messages ahead of the
    consumers (of the slowest one, on a topic)."""

    def __init__(
        self,
        index: int,
        scenario: Scenario,
        host: str,
        port: int,
        token: bytes,
        control: Control,
    ) -> None:
        self.scenario = scenario
        super().__init__(
            index,
            RawClient(host, port, scenario.stall_timeout_s, send_timeout=None),
            SendTemplate(
                scenario.destination,
                persistent=scenario.persistent,
                token=token,
                producer=index,
                size=scenario.size_bytes,
            ),
            control,
            count=scenario.count,
            receipt_every=scenario.receipt_every,
            max_in_flight=scenario.max_in_flight,
            stall_timeout_s=scenario.stall_timeout_s,
            max_batch=scenario.max_backlog,
        )

    def _pace(self, seq: int, stop: int) -> int:
        self._wait_for_backlog(stop - seq)
        return stop

    def _wait_for_backlog(self, batch: int) -> None:
        """Pause while sending ``batch`` more would put us too far ahead of the consumers."""
        scenario = self.scenario
        sent = self.control.sent
        received = self.control.received
        limit = scenario.max_backlog - batch
        topic = scenario.is_topic
        if sum(sent) - (min(received) if topic else sum(received)) <= limit:
            return
        waited_since = time.monotonic()
        while sum(sent) - (min(received) if topic else sum(received)) > limit:
            if self.control.stop.is_set():
                raise Aborted("the run was stopped")
            if time.monotonic() - waited_since > scenario.stall_timeout_s:
                raise TimeoutError(
                    f"consumers fell {scenario.max_backlog} messages behind and made no"
                    f" progress for {scenario.stall_timeout_s:g} s"
                )
            # Doubles as the sleep: waits for the server or for _BACKLOG_POLL_S.
            self._poll()
