"""The broker's memory: what each module may hold, and what it holds now.

* `_budget`: module budgets, the theoretical maximum and Qpid's estimate. Pure arithmetic on
  a `Config`, with the measured per-unit costs.
* `_wizard`: `mpbroker config wizard`: budgets derived from the memory and the load. Pure.
* `_memwatch`: MemWatch's levels on readings of the broker's memory. Pure.
* `_workers`: how many workers of each kind: `0` = one per usable CPU, as many as fit.
* `_measure`: the reading itself: PSS of every broker process plus its segments.
"""

from ._budget import (
    DESTINATION_SHARE,
    FIXED_COST_BYTES,
    MIN_DESTINATIONS,
    PER_CONNECTION_BYTES,
    PER_DESTINATION_BYTES,
    PER_ENTRY_BYTES,
    PER_MESSAGE_BYTES,
    PER_SUBSCRIPTION_BYTES,
    RING_HEADER_BYTES,
    Budget,
    Estimate,
    MemoryPlan,
    ProcessCost,
    check,
    estimate,
    max_destinations,
    plan,
    process_costs,
    render_plan,
    require_fits,
)
from ._measure import MemoryReading, broker_memory, broker_memory_bytes
from ._memwatch import MemWatch, private_pss_bytes
from ._wizard import Choice, WizardError, WizardInputs, WizardResult, derive
from ._workers import WorkerCount, WorkerCounts, fit_workers

__all__ = [
    "DESTINATION_SHARE",
    "FIXED_COST_BYTES",
    "MIN_DESTINATIONS",
    "PER_CONNECTION_BYTES",
    "PER_DESTINATION_BYTES",
    "PER_ENTRY_BYTES",
    "PER_MESSAGE_BYTES",
    "PER_SUBSCRIPTION_BYTES",
    "RING_HEADER_BYTES",
    "Budget",
    "Choice",
    "Estimate",
    "MemWatch",
    "MemoryPlan",
    "MemoryReading",
    "ProcessCost",
    "WizardError",
    "WizardInputs",
    "WizardResult",
    "WorkerCount",
    "WorkerCounts",
    "broker_memory",
    "broker_memory_bytes",
    "check",
    "derive",
    "estimate",
    "fit_workers",
    "max_destinations",
    "plan",
    "private_pss_bytes",
    "process_costs",
    "render_plan",
    "require_fits",
]
