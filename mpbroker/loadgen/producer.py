"""A producer process: SEND frames in big batches, a RECEIPT every so often.

One ``sendall`` carries about :data:`BATCH_BYTES` of frames. Every ``receipt_every``-th
message (and the last one) asks for a RECEIPT; at most ``max_in_flight`` of those may be
outstanding, and the producer also pauses while it is ``max_backlog`` messages ahead of the
consumers, so it measures the broker's steady state instead of filling its queues until they
refuse messages.
"""

from __future__ import annotations

import time

from mpbroker.harness import RawClient, StompError

from .control import STARTUP_TIMEOUT_S, Control, ProducerResult, Ready, describe
from .scenario import Scenario
from .wire import SendTemplate, send_explained

__all__ = ["BATCH_BYTES", "producer_main"]

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
    result: ProducerResult
    try:
        result = _Producer(index, scenario, host, port, token, control).run()
    except Exception as exc:
        result = ProducerResult(index, sent=control.sent[index], error=describe(exc))
    control.results.put(result)


class _Producer:
    def __init__(
        self,
        index: int,
        scenario: Scenario,
        host: str,
        port: int,
        token: bytes,
        control: Control,
    ) -> None:
        self.index = index
        self.scenario = scenario
        self.control = control
        self.conn = RawClient(host, port, scenario.stall_timeout_s, send_timeout=None)
        self.template = SendTemplate(
            scenario.destination,
            persistent=scenario.persistent,
            token=token,
            producer=index,
            size=scenario.size_bytes,
        )
        self.outstanding = 0

    def run(self) -> ProducerResult:
        scenario = self.scenario
        control = self.control
        conn = self.conn
        try:
            conn.connect()
            control.results.put(Ready("producer", self.index))
            # The coordinator starts producers once all processes are connected.
            if not control.start.wait(max(scenario.stall_timeout_s, 2 * STARTUP_TIMEOUT_S)):
                raise TimeoutError("the coordinator never said start")
            count = scenario.count
            every = scenario.receipt_every
            batch = max(1, min(BATCH_BYTES // self.template.frame_bytes, scenario.max_backlog))
            sent = control.sent
            seq = 0
            first_send = time.monotonic()
            cpu_start = time.process_time()
            while seq < count:
                last_of_window = min((seq // every + 1) * every, count) - 1
                stop = min(seq + batch, last_of_window + 1)
                self._wait_for_backlog(stop - seq)
                if stop == last_of_window + 1:
                    while self.outstanding >= scenario.max_in_flight:
                        self._take_receipts(scenario.stall_timeout_s, "RECEIPT")
                    data = self.template.frames(seq, last_of_window) + (
                        self.template.frame_with_receipt(last_of_window, str(last_of_window))
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
                self._take_receipts(scenario.stall_timeout_s, "RECEIPT")
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
            self._take_receipts(_BACKLOG_POLL_S, "")
