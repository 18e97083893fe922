"""Pure pipeline logic: what a p2p or pubsub worker does with each record.

No rings, no sockets, no clocks: an engine takes its collaborators (settings, outbox, flow
trackers, stores as plain callables) in its constructor, takes records from gateways,
appends the records it wants sent to an `Outbox`, and leaves the rest of its work for the
worker in one effects object per step (`take_effects()`).
"""

from ._common import Consumer, ConsumerKey, Engine, Outbox, no_byte_window
from ._queue import IndexCache, Pager, QueueEffects, QueueEngine, StoredAck, StoredRef
from ._replay import Grant, ReplayKey, ReplayScheduler
from ._topic import SharedPager, TopicEffects, TopicEngine
from ._totals import DEAD_LETTERED, DEQUEUED, ENQUEUED, EXPIRED, STOPS, DestinationTotals

__all__ = [
    "DEAD_LETTERED",
    "DEQUEUED",
    "ENQUEUED",
    "EXPIRED",
    "STOPS",
    "Consumer",
    "ConsumerKey",
    "DestinationTotals",
    "Engine",
    "Grant",
    "IndexCache",
    "Outbox",
    "Pager",
    "QueueEffects",
    "QueueEngine",
    "ReplayKey",
    "ReplayScheduler",
    "SharedPager",
    "StoredAck",
    "StoredRef",
    "TopicEffects",
    "TopicEngine",
    "no_byte_window",
]
