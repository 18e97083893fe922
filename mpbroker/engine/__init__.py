"""Pure pipeline logic: what a p2p or pubsub worker does with each record.

No rings, no sockets, no clocks: an engine takes records from gateways and appends the
records it wants sent to an `Outbox`; the worker process wires that to rings.
"""

from ._common import Consumer, ConsumerKey, Engine, Outbox
from ._queue import QueueEngine, StoredRef
from ._replay import Grant, ReplayKey, ReplayScheduler
from ._topic import TopicEngine

__all__ = [
    "Consumer",
    "ConsumerKey",
    "Engine",
    "Grant",
    "Outbox",
    "QueueEngine",
    "ReplayKey",
    "ReplayScheduler",
    "StoredRef",
    "TopicEngine",
]
