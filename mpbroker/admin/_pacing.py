"""How often a worker publishes its snapshot for the admin API. Pure.

Every `admin.stats_interval_ms`, unless building and publishing the snapshot costs more than
`MAX_SHARE` of the worker's time: a pipeline with 10,000 destinations spends tens of
milliseconds on one (docs/benchmarks.md, "Admin API"), and that time is taken from its
messages. Then the snapshots come less often, and the admin API shows older figures,
instead of the data path slowing down.
"""

from __future__ import annotations

import math

__all__ = ["MAX_SHARE", "stats_period_ms"]

MAX_SHARE = 0.05
"""The most of a worker's time its snapshots may take."""


def stats_period_ms(interval_ms: int, cost_ms: float, share: float = MAX_SHARE) -> int:
    """From the start of one snapshot to the start of the next: `interval_ms`, or longer
    when a snapshot costing `cost_ms` would take more than `share` of the time."""
    return max(interval_ms, math.ceil(cost_ms / share))
