"""The admin API: what every worker publishes, the HTTP JSON pages, their text views.

* `_collect`: the snapshots a pipeline publishes, built from its engines and trackers.
* `_server`: `GET /status` and `GET /flow` on a loopback port (a thread of the supervisor).
* `_text`: `mpbroker admin status|flow` as tables.
"""

from ._collect import consumers_snapshot, queues_snapshot, topics_snapshot
from ._server import AdminServer, WorkerRef, flow_view, status_view
from ._text import render_flow, render_status, table

__all__ = [
    "AdminServer",
    "WorkerRef",
    "consumers_snapshot",
    "flow_view",
    "queues_snapshot",
    "render_flow",
    "render_status",
    "status_view",
    "table",
    "topics_snapshot",
]
