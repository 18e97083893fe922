"""How many workers of each kind: `0` resolved to one per usable CPU, as many as fit in
`memory.max_memory`. Pure: the caller passes the usable CPUs (`mpbroker.host`) and the
partitioning the data dir was made with.

Every kind takes `0`: `broker.gateways`, `broker.p2p_workers`, `broker.pubsub_workers` and
`replay.workers`. A replay worker serves whole pubsub partitions, so `0` gives at most one
per pubsub worker (another would serve nothing). Queues and topics live in the store of the
pipeline their name hashes to, so a p2p or pubsub count of `0` keeps the count the data dir
was made with (`pinned`), whatever the CPUs. When one per CPU does not fit the memory
budget, the largest count among the kinds set to `0` (and not pinned) is lowered by one at
a time until it fits, each trim said in a note; explicit counts are never changed (a config
they do not fit is refused at start, naming the modules).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mpbroker.config import Config, format_bytes, replace_settings

from ._budget import check

__all__ = ["WorkerCount", "WorkerCounts", "fit_workers"]

# (section, setting, name in notes), in the order `config show` lists them.
_KINDS = (
    ("broker", "gateways", "gateways"),
    ("broker", "p2p_workers", "p2p workers"),
    ("broker", "pubsub_workers", "pubsub workers"),
    ("replay", "workers", "replay workers"),
)
# Which kind gives way first among equal counts: replay workers (idle but for returning
# durable subscribers), then the pipelines (each brings its own store and queue budgets,
# the largest of all), gateways last (each costs only its rings and buffers).
_TRIM_FIRST = ("replay.workers", "broker.pubsub_workers", "broker.p2p_workers", "broker.gateways")


@dataclass(frozen=True, slots=True)
class WorkerCount:
    """One kind's effective count and why."""

    setting: str  # "broker.gateways"
    value: int
    why: str


@dataclass(frozen=True, slots=True)
class WorkerCounts:
    """`fit_workers`' answer: the config with every count explicit, each count's reason,
    and a note for each count that memory trimmed (logged at start)."""

    config: Config
    counts: tuple[WorkerCount, ...]
    notes: tuple[str, ...]


def fit_workers(config: Config, cpus: int, pinned: tuple[int, int] | None = None) -> WorkerCounts:
    """Resolve every `0` count of `config` for `cpus` usable CPUs; `pinned` is the (p2p,
    pubsub) count the data dir was made with, None for a new one."""
    cpu_text = f"one per usable CPU ({cpus})"
    values: dict[str, int] = {}
    whys: dict[str, str] = {}
    auto: list[str] = []
    for section, name, _label in _KINDS:
        key = f"{section}.{name}"
        settings = getattr(config, section)
        value = int(getattr(settings, name))
        if value:
            default = {f.name: f.default for f in dataclasses.fields(settings)}[name]
            values[key], whys[key] = value, "the default" if value == default else "set"
            continue
        if pinned is not None and name in ("p2p_workers", "pubsub_workers"):
            kept = pinned[0] if name == "p2p_workers" else pinned[1]
            values[key] = kept
            whys[key] = f"0: the {kept} the data dir's stores were made with"
            continue
        auto.append(key)
        values[key] = cpus
        whys[key] = f"0: {cpu_text}"
    if "replay.workers" in auto:
        pubsub = values["broker.pubsub_workers"]
        if pubsub < cpus:
            values["replay.workers"] = pubsub
            whys["replay.workers"] = f"0: {cpu_text}, at most one per pubsub worker ({pubsub})"
    wanted = dict(values)
    fitted = _with(config, values)
    while check(fitted) is not None:
        trimmable = [key for key in auto if values[key] > 1]
        if not trimmable:
            break  # explicit counts or one of each: require_fits says what does not fit
        largest = max(trimmable, key=lambda key: (values[key], -_TRIM_FIRST.index(key)))
        values[largest] -= 1
        fitted = _with(config, values)
    notes = []
    for section, name, label in _KINDS:
        key = f"{section}.{name}"
        if values[key] != wanted[key]:
            trim = (
                f"{values[key]} of {wanted[key]}: more would not fit in memory.max_memory = "
                f"{format_bytes(config.memory.max_memory)}"
            )
            whys[key] += f", trimmed to {trim}"
            note = f"{label}: {trim} ({key} = 0)"
            if name in ("p2p_workers", "pubsub_workers"):
                # Recorded with the data dir's partitions: raising max_memory later keeps it.
                note += "; a new data dir keeps this count"
            notes.append(note)
    counts = tuple(
        WorkerCount(f"{s}.{n}", values[f"{s}.{n}"], whys[f"{s}.{n}"]) for s, n, _ in _KINDS
    )
    return WorkerCounts(fitted, counts, tuple(notes))


def _with(config: Config, values: dict[str, int]) -> Config:
    config = replace_settings(
        config,
        "broker",
        gateways=values["broker.gateways"],
        p2p_workers=values["broker.p2p_workers"],
        pubsub_workers=values["broker.pubsub_workers"],
    )
    return replace_settings(config, "replay", workers=values["replay.workers"])
