"""What one benchmark run does: a frozen, picklable description shared by every process."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

__all__ = ["ACK_MODES", "Scenario", "check_counts"]

#: STOMP ack modes a consumer may subscribe with.
ACK_MODES: tuple[str, ...] = ("auto", "client", "client-individual")


@dataclass(frozen=True, slots=True)
class Scenario:
    """The load: who sends what where, and how consumers acknowledge it.

    ``count`` is per producer. On a topic every consumer must get every message, so the
    expected deliveries are ``producers * count * consumers``; on a queue each message goes to
    exactly one consumer, so they are ``producers * count``.
    """

    producers: int = 1
    consumers: int = 1
    destination: str = "/queue/bench"
    size_bytes: int = 100
    count: int = 100_000
    persistent: bool = False
    ack: str = "auto"
    prefetch: int = 1000
    # A SEND asks for a RECEIPT every this many messages (and the last one always does);
    # a producer waits while more than max_in_flight receipts are outstanding.
    receipt_every: int = 1000
    max_in_flight: int = 4
    # Producers pause while they are this many messages ahead of the consumers. Receipts
    # alone do not bound that: the broker answers a receipt when the message is queued, not
    # when it is consumed, and refuses messages past a queue's max_messages (100000) or a
    # slow topic subscriber's max_pending_messages (10000).
    max_backlog: int = 5000
    # Client modes: a consumer acknowledges every this many messages (cumulatively for
    # "client", one ACK frame per message, written together, for "client-individual").
    ack_every: int = 250
    # The run aborts when no message arrives for this long.
    stall_timeout_s: float = 30.0

    @property
    def is_topic(self) -> bool:
        return self.destination.startswith("/topic/")

    @property
    def expected_deliveries(self) -> int:
        sent = self.producers * self.count
        return sent * self.consumers if self.is_topic else sent

    @property
    def label(self) -> str:
        """A short name for reports, e.g. ``queue 1->1 100B auto``."""
        kind = "topic" if self.is_topic else "queue"
        flags = " persistent" if self.persistent else ""
        return f"{kind} {self.producers}->{self.consumers} {self.size_bytes}B {self.ack}{flags}"


def check_counts(leading: Mapping[str, int], args: argparse.Namespace) -> None:
    """Refuse (``ValueError``) the first whole-number option below 1: those of ``leading``
    (option name -> value), then those both the bench (:mod:`~mpbroker.loadgen.cli`) and the
    selector study (:mod:`~mpbroker.loadgen.filterbench`) take from ``args``: --count,
    --prefetch, --receipt-every, --max-in-flight, --max-backlog and --repeat."""
    counts = {
        **leading,
        "--count": args.count,
        "--prefetch": args.prefetch,
        "--receipt-every": args.receipt_every,
        "--max-in-flight": args.max_in_flight,
        "--max-backlog": args.max_backlog,
        "--repeat": args.repeat,
    }
    for name, value in counts.items():
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
