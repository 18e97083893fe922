"""A consumer process: one subscription, big reads, acknowledgements in batches.

Each read of up to :data:`mpbroker.harness.RECV_BYTES` is parsed in one call and its bodies are
tallied together. In client modes the consumer acknowledges every ``ack_every`` messages --
one cumulative ACK for ``client``, one ACK frame per message, written with one system call,
for ``client-individual`` -- and whatever it holds when the stream pauses, so a window never
stays full of messages it has already read.
"""

from __future__ import annotations

import time

from mpbroker.harness import RawClient, StompError
from mpbroker.stomp import Frame, encode_frame

from .control import ConsumerResult, Control, Ready, describe
from .scenario import Scenario
from .tally import Tally
from .wire import body_prefix, send_explained

__all__ = ["consumer_main"]

# A read that waits this long without data lets the consumer flush acknowledgements and look
# at the stop flag. Short, because at the end of a run the coordinator waits on it.
_IDLE_S = 0.05
_SUBSCRIPTION_ID = "0"


def consumer_main(
    index: int, scenario: Scenario, host: str, port: int, token: bytes, control: Control
) -> None:
    """Process entry point: run, then report a :class:`ConsumerResult` (with any error)."""
    consumer: _Consumer | None = None
    result: ConsumerResult
    try:
        consumer = _Consumer(index, scenario, host, port, token, control)
        result = consumer.run()
    except Exception as exc:
        tally = consumer.tally if consumer is not None else None
        last = consumer.last_receive if consumer is not None else 0.0
        result = ConsumerResult(index, tally=tally, last_receive=last, error=describe(exc))
    control.results.put(result)


class _Consumer:
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
        self.tally = Tally(body_prefix(token), scenario.producers, scenario.count)
        self.last_receive = 0.0
        self.reads = 0
        self.conn = RawClient(host, port, scenario.stall_timeout_s, send_timeout=None)
        # Client modes: ack ids of messages read but not acknowledged yet. For "client" only
        # the newest matters (the ACK is cumulative); the count decides when to send it.
        self.unacked: list[str] = []
        self.unacked_count = 0

    def run(self) -> ConsumerResult:
        scenario = self.scenario
        control = self.control
        conn = self.conn
        try:
            conn.connect()
            conn.send(
                "SUBSCRIBE",
                {
                    "id": _SUBSCRIPTION_ID,
                    "destination": scenario.destination,
                    "ack": scenario.ack,
                    "activemq.prefetchSize": str(scenario.prefetch),
                    "receipt": "subscribed",
                },
            )
            conn.expect("RECEIPT", "subscribed")
            control.results.put(Ready("consumer", self.index))
            cpu_start = time.process_time()
            self._receive()
            self._flush_acks()
            conn.disconnect()
            return ConsumerResult(
                self.index,
                tally=self.tally,
                last_receive=self.last_receive,
                cpu_s=time.process_time() - cpu_start,
                reads=self.reads,
            )
        finally:
            conn.close()

    def _receive(self) -> None:
        conn = self.conn
        tally = self.tally
        stop = self.control.stop
        received = self.control.received
        index = self.index
        acking = self.scenario.ack != "auto"
        ack_every = self.scenario.ack_every
        while True:
            frames = conn.read(_IDLE_S)
            if frames is None:
                if stop.is_set():
                    return
                self._flush_acks()
                continue
            bodies = [frame.body for frame in frames if frame.command == "MESSAGE"]
            if bodies:
                self.last_receive = time.monotonic()
                self.reads += 1
                tally.add(bodies)
                received[index] = tally.received
            if len(bodies) != len(frames):
                for frame in frames:
                    if frame.command == "ERROR":
                        raise StompError(frame)
            if acking and bodies:
                self._note_acks(frames)
                if self.unacked_count >= ack_every:
                    self._flush_acks()
            if stop.is_set():
                return

    def _note_acks(self, frames: list[Frame]) -> None:
        try:
            ids = [frame.headers["ack"] for frame in frames if frame.command == "MESSAGE"]
        except KeyError:
            raise ValueError(
                f"a MESSAGE frame has no ack header, which STOMP 1.2 requires in"
                f" {self.scenario.ack} mode"
            ) from None
        self.unacked_count += len(ids)
        if self.scenario.ack == "client":
            self.unacked = ids[-1:]
        else:
            self.unacked.extend(ids)

    def _flush_acks(self) -> None:
        if not self.unacked:
            return
        acks = b"".join(encode_frame(Frame("ACK", {"id": i})) for i in self.unacked)
        send_explained(self.conn, acks)
        self.unacked = []
        self.unacked_count = 0
