"""The pipelines: what a p2p or pubsub worker does with the records of its partition.

Nearly pure: a pipeline owns its engines and stores (given to it), takes records from
gateways and answers with records for them; no rings, no processes (workers/pipeline.py is
the process shell).

* `Pipeline` (`_base`): the restart hold, flow-control announcements, expiry scans, paging.
* `P2PPipeline` (`_p2p`): queues; `QueuePersistence` (`_persistence`, group commit), the
  quota waiting room (`_quota`).
* `PubSubPipeline` (`_pubsub`): topics; durable subscriptions and their replays
  (`_durable`).
* `VolatilePaging` (`_paging`): non-persistent messages to the temp store when memory is
  short.
"""

from ._base import Pipeline
from ._durable import Durables, TopicPersistence, durable_queue
from ._p2p import P2PPipeline
from ._paging import VolatilePaging, open_temp_store, paging_enabled
from ._persistence import QueuePersistence, index_cache, refuse_unstored
from ._pubsub import PubSubPipeline
from ._quota import QuotaWaitingRoom, StopChange

__all__ = [
    "Durables",
    "P2PPipeline",
    "Pipeline",
    "PubSubPipeline",
    "QueuePersistence",
    "QuotaWaitingRoom",
    "StopChange",
    "TopicPersistence",
    "VolatilePaging",
    "durable_queue",
    "index_cache",
    "open_temp_store",
    "paging_enabled",
    "refuse_unstored",
]
