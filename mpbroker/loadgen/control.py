"""What the coordinator shares with its producer and consumer processes.

Progress goes through shared-memory counters (one slot per process, written only by that
process, so no lock is needed; an aligned 8-byte store is atomic on the machines we run on),
because producers read them every batch to stay within the backlog. Everything else -- ready
notices and final results -- goes through one multiprocessing queue.
"""

from __future__ import annotations

import ctypes
import multiprocessing.queues
from dataclasses import dataclass
from multiprocessing.context import SpawnContext
from multiprocessing.synchronize import Event

from .tally import Tally

__all__ = [
    "STARTUP_TIMEOUT_S",
    "ConsumerResult",
    "Control",
    "Counters",
    "ProducerResult",
    "Ready",
    "WorkerMessage",
    "describe",
]

Counters = ctypes.Array[ctypes.c_longlong]

#: How long processes get to connect and to be started, whatever ``--timeout`` says: spawned
#: processes import Python and the codec first, which alone can take seconds on a loaded
#: machine. (A server that does not answer is caught sooner, by the CONNECT timeout.)
STARTUP_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class Ready:
    """A process is connected (and, for a consumer, subscribed) and waits for the start."""

    role: str
    index: int


@dataclass(frozen=True, slots=True)
class ProducerResult:
    index: int
    sent: int = 0
    #: time.monotonic() just before the first send (CLOCK_MONOTONIC, the same in every
    #: process on Linux, so times of different processes compare).
    first_send: float = 0.0
    #: time.monotonic() when the RECEIPT of the last message arrived.
    done: float = 0.0
    #: CPU seconds this process used from the start signal to the end.
    cpu_s: float = 0.0
    error: str = ""


@dataclass(frozen=True, slots=True)
class ConsumerResult:
    index: int
    tally: Tally | None = None
    #: time.monotonic() of the read that brought the last message.
    last_receive: float = 0.0
    #: CPU seconds this process used from its subscription to the end.
    cpu_s: float = 0.0
    #: Socket reads that brought at least one MESSAGE: deliveries / reads is how well the
    #: server batches its writes.
    reads: int = 0
    error: str = ""


WorkerMessage = Ready | ProducerResult | ConsumerResult


@dataclass(frozen=True, slots=True)
class Control:
    """Handed to every process at spawn time (these objects cannot be pickled later)."""

    #: Set once every process is ready: producers begin sending.
    start: Event
    #: Set when every delivery arrived or the run is aborted: consumers acknowledge what
    #: they hold, disconnect and report; producers that are still sending give up.
    stop: Event
    #: Messages sent so far, one slot per producer.
    sent: Counters
    #: This run's messages received so far (duplicates included), one slot per consumer.
    received: Counters
    results: multiprocessing.queues.Queue[WorkerMessage]

    @classmethod
    def create(cls, ctx: SpawnContext, producers: int, consumers: int) -> Control:
        return cls(
            start=ctx.Event(),
            stop=ctx.Event(),
            sent=ctx.RawArray(ctypes.c_longlong, producers),
            received=ctx.RawArray(ctypes.c_longlong, consumers),
            results=ctx.Queue(),
        )


def describe(exc: BaseException) -> str:
    """An exception as one line for the report."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
