"""The admin API: what every worker publishes, the HTTP JSON pages, their text views.

* `_snapshots`: the JSON, defined once: typed, frozen snapshots and pages.
* `_collect`: the snapshots a pipeline publishes, built from its engines and trackers.
* `_server`: `GET /status` and `GET /flow` on a loopback port (a thread of the supervisor).
* `_text`: `mpbroker admin status|flow` as tables.
"""

from ._collect import queue_worker_stats, topic_worker_stats
from ._server import AdminServer, WorkerRef, flow_view, status_view
from ._snapshots import (
    ConsumerRow,
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
    decode,
    encode,
    without_details,
)
from ._text import render_flow, render_status, table

__all__ = [
    "AdminServer",
    "ConsumerRow",
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
    "WorkerRef",
    "WorkerStats",
    "WorkerStatus",
    "decode",
    "encode",
    "flow_view",
    "queue_worker_stats",
    "render_flow",
    "render_status",
    "status_view",
    "table",
    "topic_worker_stats",
    "without_details",
]
