"""A consumer process: one subscription, big reads, acknowledgements in batches.

Each read of up to :data:`mpbroker.harness.RECV_BYTES` is parsed in one call and its bodies are
tallied together. In client modes the consumer acknowledges every ``ack_every`` messages --
one cumulative ACK for ``client``, one ACK frame per message, written with one system call,
for ``client-individual`` -- and whatever it holds when the stream pauses, so a window never
stays full of messages it has already read.

:class:`Receiver` is the connection and read loop without the acknowledgements; the selector
study's subscriber connections (:mod:`mpbroker.loadgen.filterproc`) build on it too.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any, Generic, Protocol, TypeVar

from mpbroker.harness import RawClient, StompError
from mpbroker.stomp import Frame, encode_frame

from .control import ConsumerResult, Control, Ready, describe
from .scenario import Scenario
from .tally import Tally
from .wire import body_prefix, send_explained

__all__ = ["Receiver", "consumer_main"]

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


class _Tally(Protocol):
    """What :class:`Receiver` needs of a tally: it adds a read's deliveries and counts them."""

    received: int

    def add(self, deliveries: Iterable[Any], /) -> None: ...


TallyT = TypeVar("TallyT", bound=_Tally)
ResultT = TypeVar("ResultT", bound=ConsumerResult)


class Receiver(ABC, Generic[TallyT, ResultT]):
    """A consumer process's connection and read loop, which the bench's consumers and the
    selector study's subscriber connections share.

    :meth:`run` connects, subscribes (:meth:`_subscribe`), reports :class:`Ready`, reads
    until the coordinator says stop (:meth:`_receive`: each read's deliveries, picked out by
    :meth:`_deliveries`, go into ``tally``), lets a subclass finish (:meth:`_finish`),
    disconnects and reports :meth:`_result`. ``last_receive`` and ``reads`` are kept for the
    report, also when a read fails.
    """

    def __init__(
        self,
        index: int,
        host: str,
        port: int,
        stall_timeout_s: float,
        control: Control,
        tally: TallyT,
    ) -> None:
        self.index = index
        self.control = control
        self.tally = tally
        self.last_receive = 0.0
        self.reads = 0
        self.conn = RawClient(host, port, stall_timeout_s, send_timeout=None)

    @abstractmethod
    def _subscribe(self) -> None:
        """Subscribe on the connected ``conn``; return once the server confirmed it."""

    @abstractmethod
    def _deliveries(self, frames: list[Frame]) -> list[Any]:
        """What ``tally`` records of a read's MESSAGE frames (one item per MESSAGE)."""

    @abstractmethod
    def _result(self, cpu_s: float) -> ResultT:
        """The report of a run that ended well, ``cpu_s`` CPU seconds after the subscription."""

    def _idle(self) -> None:
        """Called when a read brought nothing (and the run goes on)."""

    def _after_read(self, frames: list[Frame]) -> None:
        """Called after a read that brought MESSAGE frames (``frames``: all it brought)."""

    def _finish(self) -> None:
        """Called once the coordinator said stop, before the DISCONNECT."""

    def run(self) -> ResultT:
        conn = self.conn
        try:
            conn.connect()
            self._subscribe()
            self.control.results.put(Ready("consumer", self.index))
            cpu_start = time.process_time()
            self._receive()
            self._finish()
            conn.disconnect()
            return self._result(time.process_time() - cpu_start)
        finally:
            conn.close()

    def _receive(self) -> None:
        """Read until the coordinator says stop; an ERROR frame raises :class:`StompError`."""
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
                self._idle()
                continue
            deliveries = self._deliveries(frames)
            if deliveries:
                self.last_receive = time.monotonic()
                self.reads += 1
                tally.add(deliveries)
                received[index] = tally.received
            if len(deliveries) != len(frames):
                for frame in frames:
                    if frame.command == "ERROR":
                        raise StompError(frame)
            if deliveries:
                self._after_read(frames)
            if stop.is_set():
                return


class _Consumer(Receiver[Tally, ConsumerResult]):
    """A consumer of the bench: one subscription; in client modes it acknowledges every
    ``ack_every`` messages and whatever it holds when the stream pauses."""

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
            host,
            port,
            scenario.stall_timeout_s,
            control,
            Tally(body_prefix(token), scenario.producers, scenario.count),
        )
        self.acking = scenario.ack != "auto"
        # Client modes: ack ids of messages read but not acknowledged yet. For "client" only
        # the newest matters (the ACK is cumulative); the count decides when to send it.
        self.unacked: list[str] = []
        self.unacked_count = 0

    def _subscribe(self) -> None:
        scenario = self.scenario
        self.conn.send(
            "SUBSCRIBE",
            {
                "id": _SUBSCRIPTION_ID,
                "destination": scenario.destination,
                "ack": scenario.ack,
                # The window under both brokers' names: ActiveMQ's (which mpbroker takes
                # first) and RabbitMQ's, which ignores the other (docs/benchmarks.md).
                "activemq.prefetchSize": str(scenario.prefetch),
                "prefetch-count": str(scenario.prefetch),
                "receipt": "subscribed",
            },
        )
        self.conn.expect("RECEIPT", "subscribed")

    def _deliveries(self, frames: list[Frame]) -> list[Any]:
        return [frame.body for frame in frames if frame.command == "MESSAGE"]

    def _result(self, cpu_s: float) -> ConsumerResult:
        return ConsumerResult(
            self.index,
            tally=self.tally,
            last_receive=self.last_receive,
            cpu_s=cpu_s,
            reads=self.reads,
        )

    def _idle(self) -> None:
        self._flush_acks()

    def _after_read(self, frames: list[Frame]) -> None:
        if self.acking:
            self._note_acks(frames)
            if self.unacked_count >= self.scenario.ack_every:
                self._flush_acks()

    def _finish(self) -> None:
        self._flush_acks()

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
