"""Flow control logic: when producers must stop, slow down, or wait. Pure logic.

docs/architecture.md, "Flow control": every limit is a pair of watermarks, crossing `high` stops
producers and only falling to `low` starts them again.

* `Watermark`, `Level`: one watermark pair and its armed state on one running value.
* `StoreLimits`, `FlowTracker`, `FlowChange`: per-destination and global store limits on
  messages and bytes; reports which destinations are stopped and why.
* `RateSettings`, `RateFlow`: WebLogic-style rate-based producer flow (geometric decay
  while armed, linear recovery after).
* `QuotaSettings`, `QuotaPolicy`, `Quota`: WebLogic-style named quotas with FIFO or
  preemptive service of waiting senders.
* `DiskFree`: RabbitMQ's disk_free_limit on a store's filesystem; `append_margin`,
  `append_need`, `commit_pages`: the most one append of a store may take (`SqliteFiles`).
* `DestinationLimit`: broker.max_destinations over every pipeline: may one more be made.
* `FlowGate`, `Stop`: a gateway's view of its pipelines' stops: which SEND must wait.
* `store_limits`: a config section's watermarks as `StoreLimits`.
* `expired_log_line`: the expiry policies' log format (its fields: config.parse_log_fields).

No sockets, no clocks, no stores: callers pass in amounts and the current time, and the
workers wire the results to rings and gateways.
"""

from ._destinations import DestinationLimit
from ._disk import DiskFree, SqliteFiles, append_margin, append_need, commit_pages
from ._expiry import (
    DISCARD,
    EXPIRY_POLICIES,
    HEADER_FIELDS,
    ExpiryPolicy,
    expired_log_line,
    expiry_policies,
)
from ._gate import (
    STORE_DISK,
    STORE_LIVE,
    STORE_MEMORY,
    STORE_PERSISTENT_QUEUES,
    STORE_QUOTAS,
    STORE_TEMP,
    STORE_TOPICS,
    STORE_VOLATILE_QUEUES,
    FlowGate,
    Stop,
)
from ._limits import (
    GLOBAL,
    FlowChange,
    FlowTracker,
    StoreLimits,
    destination_limits,
    store_limits,
)
from ._quota import NO_LIMIT, Quota, QuotaBook, QuotaPolicy, QuotaSettings
from ._rate import RateFlow, RateSettings, rate_settings_for, throttle_rate_settings
from ._watermark import OFF, Level, Watermark

__all__ = [
    "DISCARD",
    "EXPIRY_POLICIES",
    "GLOBAL",
    "HEADER_FIELDS",
    "NO_LIMIT",
    "OFF",
    "STORE_DISK",
    "STORE_LIVE",
    "STORE_MEMORY",
    "STORE_PERSISTENT_QUEUES",
    "STORE_QUOTAS",
    "STORE_TEMP",
    "STORE_TOPICS",
    "STORE_VOLATILE_QUEUES",
    "DestinationLimit",
    "DiskFree",
    "ExpiryPolicy",
    "FlowChange",
    "FlowGate",
    "FlowTracker",
    "Level",
    "Quota",
    "QuotaBook",
    "QuotaPolicy",
    "QuotaSettings",
    "RateFlow",
    "RateSettings",
    "SqliteFiles",
    "Stop",
    "StoreLimits",
    "Watermark",
    "append_margin",
    "append_need",
    "commit_pages",
    "destination_limits",
    "expired_log_line",
    "expiry_policies",
    "rate_settings_for",
    "store_limits",
    "throttle_rate_settings",
]
