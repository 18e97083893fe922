"""What a gateway knows of its pipelines' flow states: which SEND must wait. Pure.

Pipelines announce stops and releases (`FlowState` records); the gateway asks, before it
takes a SEND, whether a stop applies to it: one for its destination, or a global one of the
store the message would go to. A SEND in a transaction is not held here (the transaction
budget bounds it; it reaches the pipeline at COMMIT).
"""

from __future__ import annotations

from typing import Final

from mpbroker.records import FlowState
from mpbroker.routing import Topology, UnknownDestination, parse_destination

__all__ = [
    "STORE_DISK",
    "STORE_LIVE",
    "STORE_MEMORY",
    "STORE_PERSISTENT_QUEUES",
    "STORE_QUOTAS",
    "STORE_TEMP",
    "STORE_TOPICS",
    "STORE_VOLATILE_QUEUES",
    "FlowGate",
    "Stop",
]

# The config section whose limits a FlowState is about.
STORE_VOLATILE_QUEUES: Final = "vol_queue_store"
STORE_PERSISTENT_QUEUES: Final = "pers_queue_store"
STORE_TOPICS: Final = "topic_store"
STORE_LIVE: Final = "topics"  # the topic live buffer: slow subscribers
STORE_QUOTAS: Final = "quotas"  # named quotas: senders wait in the owner
STORE_TEMP: Final = "temp_store"  # paged non-persistent bodies: the temp store is full
STORE_MEMORY: Final = "memory"  # MemWatch: a large message waits while memory is short
STORE_DISK: Final = "disk"  # the store's filesystem is below store.disk_free_limit_bytes

# (pipeline, store, destination or "" for the whole store)
_Key = tuple[int, str, str]


class Stop:
    """Why a SEND waits: the limit, where it is configured, and whether it is global."""

    __slots__ = ("destination", "reason", "store")

    def __init__(self, destination: str, store: str, reason: str) -> None:
        self.destination = destination  # "" for a global limit
        self.store = store
        self.reason = reason

    def __repr__(self) -> str:
        return f"Stop({self.destination!r}, {self.store!r}, {self.reason!r})"


class FlowGate:
    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.stops: dict[_Key, str] = {}

    def apply(self, state: FlowState) -> None:
        key = (state.pipeline, state.store, state.destination)
        if state.reason:
            self.stops[key] = state.reason
        else:
            self.stops.pop(key, None)

    def pipeline_restarted(self, pipeline: int) -> None:
        """Its successor announces the stops that still hold."""
        for key in [k for k in self.stops if k[0] == pipeline]:
            del self.stops[key]

    def stop_for(self, destination: str, persistent: bool) -> Stop | None:
        """The stop a SEND to `destination` waits for, or None if it may go."""
        if not self.stops:
            return None
        try:
            pipeline = self.topology.owner(destination)
            kind, _ = parse_destination(destination)
        except UnknownDestination:
            return None  # the session refuses it, with the reason
        if kind == "queue":
            stores: tuple[str, ...] = (
                (STORE_DISK, STORE_PERSISTENT_QUEUES, STORE_QUOTAS)
                if persistent
                else (STORE_VOLATILE_QUEUES, STORE_TEMP, STORE_QUOTAS)
            )
        else:
            stores = (
                (STORE_DISK, STORE_LIVE, STORE_TOPICS) if persistent else (STORE_LIVE, STORE_TEMP)
            )
        for store in stores:
            for scope in (destination, ""):
                reason = self.stops.get((pipeline, store, scope))
                if reason:
                    return Stop(scope, store, reason)
        return None
