"""The admin API: what every worker publishes, the HTTP JSON pages, their text views.

* `_snapshots`: the JSON, defined once: typed, frozen snapshots and pages.
* `_collect`: the snapshots a pipeline publishes, built from its engines and trackers.
* `_pacing`: how often a worker publishes (less often when its snapshots cost much).
* `server` (its own import: only the supervisor needs it, not every worker): `GET /status`
  and `GET /flow` on a loopback port, a thread of the supervisor.
* `text` (its own import, for `mpbroker admin`): the pages as tables.
* `access` (its own import, for the server and `mpbroker admin`): who may read the pages
  (HTTP Basic credentials of a user in group `admin`, with a users file).
"""

from ._collect import queue_worker_stats, topic_worker_stats
from ._pacing import stats_period_ms
from ._snapshots import (
    ConsumerRow,
    DestinationsStatus,
    DurableRow,
    FlowView,
    GatewayStats,
    GlobalStoreFigures,
    HeldSend,
    MemoryLevel,
    MemoryStatus,
    QueueRow,
    QueueWorkerStats,
    ReplayStats,
    StatusView,
    StoreFigures,
    TempStoreStats,
    TopicRow,
    TopicWorkerStats,
    WorkerStats,
    WorkerStatus,
    consumers_of,
    decode,
    encode,
    stopped_by,
    waiting_of,
    with_durable_backlogs,
    without_details,
)

__all__ = [
    "ConsumerRow",
    "DestinationsStatus",
    "DurableRow",
    "FlowView",
    "GatewayStats",
    "GlobalStoreFigures",
    "HeldSend",
    "MemoryLevel",
    "MemoryStatus",
    "QueueRow",
    "QueueWorkerStats",
    "ReplayStats",
    "StatusView",
    "StoreFigures",
    "TempStoreStats",
    "TopicRow",
    "TopicWorkerStats",
    "WorkerStats",
    "WorkerStatus",
    "consumers_of",
    "decode",
    "encode",
    "queue_worker_stats",
    "stats_period_ms",
    "stopped_by",
    "topic_worker_stats",
    "waiting_of",
    "with_durable_backlogs",
    "without_details",
]
