"""Which pipeline owns a destination. Pure logic.

A destination belongs to exactly one partition: `crc32(name) % partitions` among the
workers of its kind (docs/architecture.md, "Ownership"). Pipelines are numbered p2p first, then pubsub:
with P p2p and T pubsub workers, p2p i is pipeline i and pubsub j is pipeline P + j.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "QUEUE_PREFIX",
    "TEMPORARY_PREFIXES",
    "TOPIC_PREFIX",
    "Topology",
    "UnknownDestination",
    "UnsupportedDestination",
    "check_client_destination",
    "parse_destination",
]

QUEUE_PREFIX = "/queue/"
TOPIC_PREFIX = "/topic/"

DestinationKind = Literal["queue", "topic"]


class UnknownDestination(ValueError):
    """A destination that is neither /queue/NAME nor /topic/NAME."""

    def __init__(self, destination: str, message: str = "") -> None:
        self.destination = destination
        super().__init__(
            message or f"unknown destination {destination!r}: use /queue/NAME or /topic/NAME"
        )


class UnsupportedDestination(UnknownDestination):
    """A destination of a kind ActiveMQ, Artemis or RabbitMQ clients use and mpbroker does
    not have (yet): temporary, wildcard, composite, with options, or RabbitMQ's exchanges.
    Refused by name, not taken as a literal name that nothing else would ever reach."""

    def __init__(self, destination: str, what: str) -> None:
        self.what = what
        super().__init__(destination, f"{what}: {destination!r}")


#: Temporary destinations of ActiveMQ's and RabbitMQ's STOMP (and RabbitMQ's reply queues).
TEMPORARY_PREFIXES = ("/temp-queue/", "/temp-topic/", "/reply-queue/")

# Destination kinds of other brokers, by prefix: what to tell their users.
_OTHER_KINDS = (
    *((prefix, "temporary destinations are not supported yet") for prefix in TEMPORARY_PREFIXES),
    ("/exchange/", "RabbitMQ exchanges are not supported: use /queue/NAME or /topic/NAME"),
    ("/amq/queue/", "RabbitMQ's /amq/queue/ is not supported: use /queue/NAME"),
)
# Characters that make a name mean more than itself in ActiveMQ (and Artemis): a composite
# destination's list, destination options.
_SPECIAL_CHARACTERS = (
    (",", "composite destinations (a,b) are not supported yet"),
    ("?", "destination options (?name=value) are not supported"),
)
# Name elements (between dots) that are wildcards in ActiveMQ and Artemis, as its
# destination filters read them: a whole element, not a character inside one.
_WILDCARD_ELEMENTS = frozenset({"*", ">"})


def check_client_destination(destination: str) -> tuple[DestinationKind, str]:
    """`parse_destination` for a destination a client names in a SEND or SUBSCRIBE, which
    also refuses (UnsupportedDestination) what other brokers read as more than a name:
    ActiveMQ's wildcards (an element ``*`` or ``>`` of a dotted name: ``prices.*``, not
    ``a*b``), composite destinations (``,``) and destination options (``?``), temporary
    destinations and RabbitMQ's exchanges. Names already stored
    (a dead-letter queue, a durable subscription) are not checked again."""
    for prefix, what in _OTHER_KINDS:
        if destination.startswith(prefix):
            raise UnsupportedDestination(destination, what)
    kind, name = parse_destination(destination)
    for char, what in _SPECIAL_CHARACTERS:
        if char in name:
            raise UnsupportedDestination(destination, what)
    if ("*" in name or ">" in name) and not _WILDCARD_ELEMENTS.isdisjoint(name.split(".")):
        raise UnsupportedDestination(
            destination, "wildcard destinations (* and >) are not supported yet"
        )
    return kind, name


def parse_destination(destination: str) -> tuple[DestinationKind, str]:
    """('queue' | 'topic', name); UnknownDestination otherwise."""
    if destination.startswith(QUEUE_PREFIX):
        kind: DestinationKind = "queue"
        name = destination[len(QUEUE_PREFIX) :]
    elif destination.startswith(TOPIC_PREFIX):
        kind = "topic"
        name = destination[len(TOPIC_PREFIX) :]
    else:
        raise UnknownDestination(destination)
    if not name or any(ord(c) < 32 for c in name):
        raise UnknownDestination(destination)
    return kind, name


# Remembered for the destinations in use (each session remembers its own too): a bound of
# names, not of destinations, since a client may name ever new ones (each ~250 B here).
@functools.lru_cache(maxsize=4096)
def _owner(p2p: int, pubsub: int, dead_letter_prefix: str, destination: str) -> int:
    kind, name = parse_destination(destination)
    if kind == "queue" and dead_letter_prefix:
        # A dead-letter queue lives with its queue, so moving a message there stays
        # inside one pipeline: DLQ.orders is owned by whoever owns orders.
        while name.startswith(dead_letter_prefix) and len(name) > len(dead_letter_prefix):
            name = name[len(dead_letter_prefix) :]
    digest = zlib.crc32(name.encode())
    if kind == "queue":
        return digest % p2p
    return p2p + digest % pubsub


@dataclass(frozen=True, slots=True)
class Topology:
    p2p: int
    pubsub: int
    dead_letter_prefix: str = "DLQ."

    @property
    def pipelines(self) -> int:
        return self.p2p + self.pubsub

    def owner(self, destination: str) -> int:
        """Index of the pipeline that owns `destination` (UnknownDestination if invalid)."""
        # Every SEND asks this: remember the answer for the destinations in use.
        return _owner(self.p2p, self.pubsub, self.dead_letter_prefix, destination)

    def role(self, pipeline: int) -> tuple[str, int]:
        """('p2p', i) or ('pubsub', j) for a pipeline index."""
        if pipeline < self.p2p:
            return "p2p", pipeline
        return "pubsub", pipeline - self.p2p
