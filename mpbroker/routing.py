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

__all__ = ["QUEUE_PREFIX", "TOPIC_PREFIX", "Topology", "UnknownDestination", "parse_destination"]

QUEUE_PREFIX = "/queue/"
TOPIC_PREFIX = "/topic/"

DestinationKind = Literal["queue", "topic"]


class UnknownDestination(ValueError):
    """A destination that is neither /queue/NAME nor /topic/NAME."""

    def __init__(self, destination: str) -> None:
        self.destination = destination
        super().__init__(f"unknown destination {destination!r}: use /queue/NAME or /topic/NAME")


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


@functools.lru_cache(maxsize=65536)
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
