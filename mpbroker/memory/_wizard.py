"""The configuration wizard: the seed's inputs in, module budgets out, with a reason each.

Pure: `derive(WizardInputs(...))` returns a `WizardResult` (the chosen settings, each with
why; the validated `Config`; its `MemoryPlan`) or raises `WizardError` naming the input
that cannot be met and by how much. `mpbroker config wizard` asks for the inputs and writes
`WizardResult.toml()`.

The rules (the seed's, on our modules; see mpbroker/memory/_budget.py for what each module is):

- Processes: as many gateways as the threads/workers input allows, at most one per CPU,
  and half as many pipelines of each kind (at most one per queue or topic), one replay
  worker. If the budgets below do not fit, the rings are made smaller first, then a process
  is dropped (gateways first) and the rest derived again: each costs its fixed cost and its
  rings.
- About half of what the fixed cost of those processes leaves of the memory goes to the
  module budgets; the other half is headroom (connections, subscriptions, consumer windows,
  garbage between collections).
- Messages: `stomp.max_frame_bytes` is the largest message plus room for its headers;
  `memory.max_message_bytes` is the largest message.
- The fixed-size modules keep the seed's defaults: socket reader threshold 64 KiB,
  uncommitted transactions 2 MiB, processing buffer 128 KiB, durable replay 2 MiB in
  256 KiB batches (at least one largest message).
- Rings: 1 MiB, the measured default; 512 KiB, then 256 KiB only when the budgets do not fit
  otherwise, before a process is dropped. A ring need not hold a message: records larger
  than a quarter of it pass in fragments. What a smaller ring costs is throughput with
  large messages only (measured against 2 MiB rings with 100 KB messages: 1 MiB keeps
  95-105 %, 512 KiB 76-92 %, 256 KiB 33-49 %; with 1 KB messages every size keeps it all).
- Destinations (`broker.max_destinations`): twice the queues and topics expected (room for
  their dead-letter queues, durable subscriptions and some growth), at least the budget's
  minimum; each costs `budget.PER_DESTINATION_BYTES`, a fixed-size module.
- Thread pools (replays at once) are inversely proportional to the largest topic message:
  `replay.global_bytes` over two batches of it (the seed's 4 for small messages).
- The index cache grows with the rate: 20 seconds of messages, at least the seed's 1000.
- What the budgets have left goes to the live buffers: to queues and topics in proportion
  to their numbers; a queue's part to the VolQueueStore and the persistent live buffer
  16 : 1 (the seed's 16 MB and 1 MB). Each must hold at least one largest message.
- Message counts: every waiting message keeps an entry in memory, paged or not -- a queue
  message its headers too, what it costs beyond its body (`budget.PER_MESSAGE_BYTES`), a
  topic message a stub (`budget.PER_ENTRY_BYTES`) -- so the counts that stop producers
  (`global_msg_high` of both queue stores, `topics.global_live_msg_high`) come out of the
  live buffers: 10 minutes of messages at the rate (all of it: one busy destination is on
  one worker), at least 1000, at most the default; lowered when they would take more than
  half of a worker's live buffer or leave no room for one largest message. A destination's
  count is kept within its store's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Final

from mpbroker.config import Config, KiB, MiB, config_from_mapping, format_bytes, iter_settings

from ._budget import (
    MIN_DESTINATIONS,
    PER_CONNECTION_BYTES,
    PER_DESTINATION_BYTES,
    PER_ENTRY_BYTES,
    PER_MESSAGE_BYTES,
    PER_SUBSCRIPTION_BYTES,
    MemoryPlan,
    check,
    plan,
    process_costs,
)

__all__ = ["Choice", "WizardError", "WizardInputs", "WizardResult", "derive"]

# Room for a message's headers in its frame: destination, ids, a dozen properties. h11
# caps a whole HTTP head at 16 KiB (DEFAULT_MAX_INCOMPLETE_EVENT_SIZE).
HEADER_ROOM_BYTES: Final = 16 * KiB
# The seed's module defaults the wizard starts from.
SEED_SOCKET_READER_BYTES: Final = 64 * KiB
SEED_UNCOMMITTED_BYTES: Final = 2 * MiB
SEED_PROCESSING_BYTES: Final = 128 * KiB
SEED_REPLAY_GLOBAL_BYTES: Final = 2 * MiB
SEED_REPLAY_BATCH_BYTES: Final = 256 * KiB
SEED_INDEX_CACHE_ENTRIES: Final = 1000
# The index cache holds this many seconds of messages at the average rate.
INDEX_CACHE_SECONDS: Final = 20
# The seed's VolQueueStore (16 MB) and persistent queue live buffer (1 MB).
VOL_SHARE, PERSISTENT_SHARE = 16, 1
# Ring sizes, best first, and the throughput each keeps of 2 MiB rings with 100 KB messages
# (measured, issue 5; with 1 KB messages every size keeps all of it). 1 MiB is the default.
RING_THROUGHPUT: Final = {1 * MiB: "95-105 %", 512 * KiB: "76-92 %", 256 * KiB: "33-49 %"}
# The message counts that stop producers hold this many seconds of messages at the rate...
BACKLOG_SECONDS: Final = 600
# ...at least this many (the seed's index cache), at most the defaults.
MIN_BACKLOG: Final = 1000
# broker.max_destinations: this many times the queues and topics expected (their
# dead-letter queues, durable subscriptions, room to grow), at least the budget's
# MIN_DESTINATIONS.
DESTINATIONS_FACTOR: Final = 2
_DEFAULTS: Final = Config()


class WizardError(ValueError):
    """The inputs cannot be met; names the input, its value and by how much it misses."""

    def __init__(self, option: str, value: str, why: str) -> None:
        self.option = option
        self.value = value
        self.why = why
        super().__init__(f"wizard: {option} {value}: {why}")


@dataclass(frozen=True, slots=True)
class WizardInputs:
    """The seed's inputs (sizes in bytes), plus the machine's CPUs."""

    memory_bytes: int
    topics: int
    queues: int
    largest_topic_message_bytes: int
    largest_queue_message_bytes: int
    rate_per_s: float  # average messages per second, all destinations together
    connections: int
    threads: int  # most threads/worker processes the broker may use
    cpus: int

    def check(self) -> None:
        """WizardError for an input out of range."""
        at_least = (
            ("--memory", self.memory_bytes, 1),
            ("--topics", self.topics, 0),
            ("--queues", self.queues, 0),
            ("--largest-topic-message", self.largest_topic_message_bytes, 1),
            ("--largest-queue-message", self.largest_queue_message_bytes, 1),
            ("--rate", self.rate_per_s, 0),
            ("--connections", self.connections, 1),
            ("--threads", self.threads, 1),
        )
        for option, value, low in at_least:
            if not value >= low or (isinstance(value, float) and not math.isfinite(value)):
                raise WizardError(option, str(value), f"must be at least {low}")
        if self.cpus < 1:
            raise WizardError("cpus", str(self.cpus), "must be at least 1")


@dataclass(frozen=True, slots=True)
class Choice:
    """One derived setting and why it has this value."""

    key: str  # "section.name"
    value: int | str
    why: str


@dataclass(frozen=True, slots=True)
class WizardResult:
    inputs: WizardInputs
    choices: tuple[Choice, ...]
    config: Config
    plan: MemoryPlan

    def mapping(self) -> dict[str, dict[str, Any]]:
        """The chosen settings as a TOML-shaped mapping."""
        data: dict[str, dict[str, Any]] = {}
        for choice in self.choices:
            section, _, name = choice.key.partition(".")
            data.setdefault(section, {})[name] = choice.value
        return data

    def summary(self) -> list[str]:
        p = self.plan
        return [
            f"theoretical maximum {format_bytes(p.maximum)} of memory.max_memory "
            f"{format_bytes(p.max_memory)}: fixed cost {format_bytes(p.fixed_cost)} "
            f"({p.process_count} processes) + module budgets {format_bytes(p.budget_total)}; "
            f"headroom {format_bytes(p.headroom)}",
        ]

    def toml(self) -> str:
        """The config file: only the derived settings, each after a comment with its reason."""
        i = self.inputs
        lines = [
            "# Written by `mpbroker config wizard` from: "
            f"memory {format_bytes(i.memory_bytes)}, {i.topics} topics, {i.queues} queues, "
            f"largest topic message {format_bytes(i.largest_topic_message_bytes)}, largest "
            f"queue message {format_bytes(i.largest_queue_message_bytes)}, {i.rate_per_s:g} "
            f"msg/s, {i.connections} connections, {i.threads} threads/workers, {i.cpus} CPUs.",
            *(f"# {line}" for line in self.summary()),
            "# Every other setting keeps its default (mpbroker config show).",
        ]
        for section, values in self.mapping().items():
            lines += ["", f"[{section}]"]
            for name, value in values.items():
                why = next(c.why for c in self.choices if c.key == f"{section}.{name}")
                lines.append(f"# {why}")
                lines.append(f"{name} = {json.dumps(value)}")
        return "\n".join(lines) + "\n"


def _kib_floor(n: float) -> int:
    return int(n) // KiB * KiB


def _kib_ceil(n: float) -> int:
    return math.ceil(n / KiB) * KiB


def _mib_more(n: float) -> str:
    """At least `n` bytes, in whole MiB (rounded up, never to two decimals of GiB)."""
    return f"{math.ceil(n / MiB)} MiB"


def _fixed_cost(gateways: int, p2p: int, pubsub: int) -> int:
    return sum(p.total for p in process_costs(gateways, p2p, pubsub, 1))


@dataclass(frozen=True, slots=True)
class _Layout:
    gateways: int
    p2p: int
    pubsub: int


def _workers(inputs: WizardInputs) -> int:
    # broker.gateways allows at most 256.
    return min(inputs.threads, inputs.cpus, 256)


def _layouts(inputs: WizardInputs) -> list[_Layout]:
    """The process layouts to try, largest first: gateways dropped first, then pipelines."""
    n = _workers(inputs)
    half = max(1, min(n // 2, 64))  # broker.p2p_workers and pubsub_workers allow 64
    p2p, pubsub = max(1, min(half, inputs.queues)), max(1, min(half, inputs.topics))
    layouts = [_Layout(g, p2p, pubsub) for g in range(n, 0, -1)]
    while p2p > 1 or pubsub > 1:
        p2p, pubsub = max(1, p2p - 1), max(1, pubsub - 1)
        layouts.append(_Layout(1, p2p, pubsub))
    return layouts


def _messages(inputs: WizardInputs) -> list[Choice]:
    largest = _largest(inputs)
    frame = _kib_ceil(largest + HEADER_ROOM_BYTES)
    return [
        Choice(
            "stomp.max_frame_bytes",
            frame,
            f"the largest message ({format_bytes(largest)}) plus {format_bytes(HEADER_ROOM_BYTES)} "
            "for its headers",
        ),
        Choice(
            "memory.max_message_bytes",
            largest,
            "the largest message: a larger body is refused with an ERROR",
        ),
    ]


def _mapping(choices: list[Choice]) -> dict[str, dict[str, Any]]:
    """The choices as a TOML-shaped mapping for `config_from_mapping`."""
    out: dict[str, dict[str, Any]] = {}
    for c in choices:
        section, _, name = c.key.partition(".")
        out.setdefault(section, {})[name] = c.value
    return out


def _largest(inputs: WizardInputs) -> int:
    return max(inputs.largest_topic_message_bytes, inputs.largest_queue_message_bytes)


def _ring(capacity: int) -> Choice:
    """The rings at `capacity`, with why (the larger sizes did not fit)."""
    largest = max(RING_THROUGHPUT)
    kept = (
        f"with 100 KB messages {format_bytes(capacity)} rings keep {RING_THROUGHPUT[capacity]} "
        "of the throughput of 2 MiB rings (measured)"
    )
    if capacity == largest:
        why = (
            f"the default, per pipeline direction: {kept}; records larger than a quarter of "
            "a ring pass in fragments"
        )
    else:
        why = (
            f"the budgets do not fit with {format_bytes(2 * capacity)} rings (smaller rings "
            f"before fewer processes: they slow only large messages): {kept}, "
            f"{format_bytes(largest)} rings {RING_THROUGHPUT[largest]}; 1 KB messages lose nothing"
        )
    return Choice("rings.capacity_bytes", capacity, why)


def derive(inputs: WizardInputs) -> WizardResult:
    """The budgets for `inputs` (see the module docstring), or WizardError."""
    inputs.check()
    messages = _messages(inputs)
    failure: WizardError | None = None
    for layout in _layouts(inputs):
        if _fixed_cost(layout.gateways, layout.p2p, layout.pubsub) >= inputs.memory_bytes:
            failure = failure or _memory_below_fixed(inputs)
            continue
        for capacity in RING_THROUGHPUT:
            try:
                return _derive(inputs, layout, [*messages, _ring(capacity)])
            except WizardError as exc:
                # The smallest layout's, with the smallest rings: the reason to report.
                failure = exc
    assert failure is not None
    raise failure


def _memory_below_fixed(inputs: WizardInputs) -> WizardError:
    processes = process_costs(1, 1, 1, 1)
    smallest = sum(p.total for p in processes)
    count = sum(p.count for p in processes)
    return WizardError(
        "--memory",
        format_bytes(inputs.memory_bytes),
        f"below the fixed cost of the smallest broker ({format_bytes(smallest)}: {count} idle "
        f"processes); with budgets and headroom it needs about {format_bytes(2 * smallest)}",
    )


def _derive(inputs: WizardInputs, layout: _Layout, base: list[Choice]) -> WizardResult:
    cpus_note = (
        f"{inputs.threads} threads/workers, at most one per CPU ({inputs.cpus})"
        if inputs.threads > inputs.cpus
        else f"{inputs.threads} threads/workers ({inputs.cpus} CPUs)"
    )
    first = _layouts(inputs)[0]
    fewer = "; fewer, so the budgets fit in the memory"
    fixed = _fixed_cost(layout.gateways, layout.p2p, layout.pubsub)
    pool = (inputs.memory_bytes - fixed) // 2
    choices = [
        Choice(
            "memory.max_memory",
            inputs.memory_bytes,
            "the memory for the broker: the PSS of all its processes together",
        ),
        Choice(
            "broker.gateways",
            layout.gateways,
            cpus_note + (fewer if layout.gateways < first.gateways else ""),
        ),
        Choice(
            "broker.p2p_workers",
            layout.p2p,
            f"half as many as the CPUs we may use, at most one per queue ({inputs.queues})"
            + (fewer if layout.p2p < first.p2p else ""),
        ),
        Choice(
            "broker.pubsub_workers",
            layout.pubsub,
            f"half as many as the CPUs we may use, at most one per topic ({inputs.topics})"
            + (fewer if layout.pubsub < first.pubsub else ""),
        ),
        Choice("replay.workers", 1, "one replay worker serves every pubsub worker"),
        Choice(
            "broker.max_connections",
            inputs.connections,
            f"the client connections expected; each costs about "
            f"{format_bytes(PER_CONNECTION_BYTES)} (measured), more are refused",
        ),
        _destinations(inputs),
        *base,
        Choice(
            "memory.socket_reader_threshold_bytes",
            SEED_SOCKET_READER_BYTES,
            "the seed's socket reader threshold (one read buffer per gateway)",
        ),
        Choice(
            "transactions.max_uncommitted_bytes",
            SEED_UNCOMMITTED_BYTES,
            "the seed's uncommitted transactions budget, per gateway"
            + (
                ""
                if _largest(inputs) <= SEED_UNCOMMITTED_BYTES
                else " (a transaction cannot hold a largest message: raise it if you send "
                "those in transactions)"
            ),
        ),
        Choice(
            "store.commit_max_bytes",
            SEED_PROCESSING_BYTES,
            "the seed's storage processing buffer, per pipeline",
        ),
        Choice(
            "replay.global_bytes",
            SEED_REPLAY_GLOBAL_BYTES,
            "the seed's durable replay budget, over all replay workers",
        ),
        Choice("replay.replay_bytes", SEED_REPLAY_BATCH_BYTES, "the seed's durable replay batch"),
        _thread_pools(inputs),
    ]
    entries = _index_entries(inputs)
    # The modules whose size is set by now, with the live buffers (and the index cache,
    # which is part of the persistent one) at next to nothing yet, their counts off.
    trial = [
        *choices,
        Choice("store.index_cache_entries", 1, ""),
        Choice("store.index_cache_bytes", 0, ""),
        Choice("vol_queue_store.global_byte_high", 1, ""),
        Choice("vol_queue_store.global_byte_low", 0, ""),
        Choice("topics.global_live_byte_high", 1, ""),
        Choice("topics.global_live_byte_low", 0, ""),
        *(
            Choice(f"{section}.{keys}_{mark}", -1, "")
            for section, (keys, _) in _COUNTS.items()
            for mark in ("high", "low")
        ),
    ]
    so_far = plan(config_from_mapping(_mapping(trial)))
    left = pool - so_far.budget_total
    if left < 0:
        raise _short(inputs, layout, pool, so_far)
    choices += _live_buffers(inputs, layout, left, entries)
    config = config_from_mapping(_mapping(choices))
    memory = plan(config)
    problem = check(config)
    if problem is not None:  # the arithmetic above keeps within the pool: a wizard bug
        raise WizardError("--memory", format_bytes(inputs.memory_bytes), problem)
    _check_connections(inputs, memory)
    # In the order `config show` lists them.
    order = {key: i for i, (key, _, _) in enumerate(iter_settings(config))}
    choices.sort(key=lambda c: order[c.key])
    return WizardResult(inputs, tuple(choices), config, memory)


def _destinations(inputs: WizardInputs) -> Choice:
    expected = inputs.queues + inputs.topics
    return Choice(
        "broker.max_destinations",
        max(MIN_DESTINATIONS, DESTINATIONS_FACTOR * expected),
        f"{DESTINATIONS_FACTOR} x the queues and topics expected ({expected}: room for their "
        f"dead-letter queues and durable subscriptions), at least {MIN_DESTINATIONS}; each "
        f"costs about {format_bytes(PER_DESTINATION_BYTES)} (measured), more are refused",
    )


def _thread_pools(inputs: WizardInputs) -> Choice:
    unit = max(inputs.largest_topic_message_bytes, SEED_REPLAY_BATCH_BYTES)
    pools = max(1, SEED_REPLAY_GLOBAL_BYTES // (2 * unit))
    return Choice(
        "replay.max_concurrent",
        pools,
        f"the seed's thread pools, inversely proportional to the largest topic message: "
        f"replay.global_bytes ({format_bytes(SEED_REPLAY_GLOBAL_BYTES)}) over two batches of "
        f"{format_bytes(unit)} (one delivered, the next read), at least 1",
    )


def _index_entries(inputs: WizardInputs) -> int:
    return max(SEED_INDEX_CACHE_ENTRIES, math.ceil(inputs.rate_per_s * INDEX_CACHE_SECONDS))


def _short(inputs: WizardInputs, layout: _Layout, pool: int, memory: MemoryPlan) -> WizardError:
    need = memory.budget_total
    biggest = sorted((b for b in memory.budgets if b.counted), key=lambda b: -b.total)[:3]
    listed = ", ".join(f"{b.module} {format_bytes(b.total)}" for b in biggest)
    short = need - pool
    gateways = f"{layout.gateways} gateway{'' if layout.gateways == 1 else 's'}"
    processes = f"{gateways}, {layout.p2p} p2p and {layout.pubsub} pubsub"
    why = (
        f"about half of what the fixed cost of the fewest processes ({processes}) leaves, "
        f"{format_bytes(pool)}, is for the budgets, but the fixed-size modules alone need "
        f"{format_bytes(need)} ({listed}); short by {format_bytes(short)}"
    )
    # Of the fixed-size modules, only the durable replay grows with the largest message (it
    # holds at least one); the rings pass larger messages in fragments.
    sized = sum(
        b.total for b in memory.budgets if b.counted and b.module.startswith("durable replay")
    )
    more = _mib_more(2 * short)
    if sized * 2 > need and _largest(inputs) > SEED_REPLAY_GLOBAL_BYTES:
        return WizardError(
            "--largest-topic-message/--largest-queue-message",
            format_bytes(_largest(inputs)),
            f"{why}, most of it for messages this large (the durable replay holds a whole "
            f"one): lower the largest message, or raise --memory by at least {more}",
        )
    return WizardError(
        "--memory",
        format_bytes(inputs.memory_bytes),
        f"{why}: raise --memory by at least {more}",
    )


# The message counts the wizard derives: section -> (the global count's key, the count's
# key per destination), without _high/_low.
_COUNTS: Final = {
    "vol_queue_store": ("global_msg", "msg"),
    "pers_queue_store": ("global_msg", "msg"),
    "topics": ("global_live_msg", "live_msg"),
}


# What a waiting message of each section keeps in memory, and its measured cost.
_ENTRY_BYTES: Final = {
    "vol_queue_store": PER_MESSAGE_BYTES,
    "pers_queue_store": PER_MESSAGE_BYTES,
    "topics": PER_ENTRY_BYTES,
}
_ENTRY_TEXT: Final = {
    "vol_queue_store": "its entry and headers",
    "pers_queue_store": "its entry and headers",
    "topics": "an entry",
}


def _backlog(inputs: WizardInputs) -> int:
    """The message counts the rate asks for, before the defaults and the memory cap them."""
    return max(MIN_BACKLOG, math.ceil(inputs.rate_per_s * BACKLOG_SECONDS))


def _counts(
    part: int, must: int, targets: tuple[int, ...], entry_bytes: int
) -> tuple[tuple[int, ...], bool]:
    """Counts for `targets` whose entries (`entry_bytes` each) fit in a live buffer part of
    `part` bytes -- at most half of it, leaving `must` bytes -- but at least MIN_BACKLOG
    each; and whether they are below the targets."""
    full = sum(targets) * entry_bytes
    least = len(targets) * MIN_BACKLOG * entry_bytes
    room = min(part // 2, part - must)
    if room >= full:
        return targets, False
    # What is above the floor, shared in proportion to what each would have had above it
    # (full > room > least).
    scale = (room - least) / (full - least) if room > least else 0.0
    counts = tuple(MIN_BACKLOG + int((t - MIN_BACKLOG) * scale) // 100 * 100 for t in targets)
    return counts, counts != targets


def _count_choices(
    inputs: WizardInputs, section: str, high: int, lowered: bool, where: str
) -> list[Choice]:
    """The global count of `section` and its low watermark, and the count per destination
    when its default is above them."""
    keys, dest = _COUNTS[section]
    defaults = getattr(_DEFAULTS, section)
    default_high, default_low = getattr(defaults, f"{keys}_high"), getattr(defaults, f"{keys}_low")
    dest_high, dest_low = getattr(defaults, f"{dest}_high"), getattr(defaults, f"{dest}_low")
    low = high * default_low // default_high
    rate = math.ceil(inputs.rate_per_s * BACKLOG_SECONDS)
    why = f"{BACKLOG_SECONDS // 60} min of messages at {inputs.rate_per_s:g} msg/s"
    if rate > default_high:
        why = f"the default; {why} would be {rate}"
    elif rate < MIN_BACKLOG:
        why += f", at least {MIN_BACKLOG}"
    if lowered:
        target = max(MIN_BACKLOG, min(rate, default_high))
        why = (
            f"lowered from {target} ({why}) so the entries take at most half of {where} and "
            f"leave room for one largest message, to no less than {MIN_BACKLOG}"
        )
    choices = [
        Choice(
            f"{section}.{keys}_high",
            high,
            f"every waiting message keeps {_ENTRY_TEXT[section]} in memory "
            f"({_ENTRY_BYTES[section]} B, measured), paged or not: {why}",
        ),
        Choice(
            f"{section}.{keys}_low",
            low,
            f"the default's ratio to the high watermark ({default_low} of {default_high})",
        ),
    ]
    if dest_high > high:
        choices += [
            Choice(
                f"{section}.{dest}_high",
                high,
                f"at most {section}.{keys}_high (the default {dest_high} is above it)",
            ),
            Choice(f"{section}.{dest}_low", min(dest_low, low), f"at most {section}.{keys}_low"),
        ]
    return choices


def _live_buffers(inputs: WizardInputs, layout: _Layout, left: int, entries: int) -> list[Choice]:
    """Split what the budgets have left between the queue and topic live buffers, and in
    each between the message bytes and the entries of the waiting messages (the counts)."""
    queues, topics = max(1, inputs.queues), max(1, inputs.topics)
    queue_part = left * queues // (queues + topics)
    queue_each = queue_part // layout.p2p
    topic_each = (left - queue_part) // layout.pubsub
    lq, lt = inputs.largest_queue_message_bytes, inputs.largest_topic_message_bytes
    backlog = _backlog(inputs)
    # The entries first: what each p2p worker's VolQueueStore and persistent store count,
    # costed in full (the cached ones are charged in the persistent live buffer instead:
    # what that leaves goes to the cache's bodies).
    vol_default = _DEFAULTS.vol_queue_store.global_msg_high
    pers_default = _DEFAULTS.pers_queue_store.global_msg_high
    # What the bytes need: a largest message in the VolQueueStore (16/17 of the queue's),
    # a largest topic message, and a KiB for each rounding down.
    queue_must = _kib_ceil(lq * (VOL_SHARE + PERSISTENT_SHARE) / VOL_SHARE) + 2 * KiB
    (vol_count, pers_count), queue_lowered = _counts(
        queue_each,
        queue_must,
        (min(backlog, vol_default), min(backlog, pers_default)),
        PER_MESSAGE_BYTES,
    )
    (topic_count,), topic_lowered = _counts(
        topic_each,
        lt + KiB,
        (min(backlog, _DEFAULTS.topics.global_live_msg_high),),
        PER_ENTRY_BYTES,
    )
    queue_bytes = queue_each - (vol_count + pers_count) * PER_MESSAGE_BYTES
    persistent = queue_bytes * PERSISTENT_SHARE // (VOL_SHARE + PERSISTENT_SHARE)
    vol = _kib_floor(queue_bytes - persistent)
    topic_bytes = _kib_floor(topic_each - topic_count * PER_ENTRY_BYTES)
    # The persistent share holds the cached bodies, and the entries of the cache beyond
    # the store's count (those within it were charged with the count).
    discount = min(pers_count, entries) * PER_MESSAGE_BYTES
    cache_bytes = _kib_floor(persistent + discount - entries * PER_MESSAGE_BYTES)
    if cache_bytes < 0:
        # Not even the entries fit: cache as many as half the share holds.
        entries = max(1, persistent // 2 // PER_MESSAGE_BYTES)
        discount = min(pers_count, entries) * PER_MESSAGE_BYTES
        cache_bytes = _kib_floor(max(0, persistent + discount - entries * PER_MESSAGE_BYTES))
    if vol < lq:
        # More memory raises the pool by half of it, the queues get their share of that,
        # and the VolQueueStore 16/17 of each p2p worker's part (the counts are at their
        # least already).
        short = lq - vol
        more = 2 * short * layout.p2p * (queues + topics) * (VOL_SHARE + PERSISTENT_SHARE)
        more //= queues * VOL_SHARE
        raise WizardError(
            "--largest-queue-message",
            format_bytes(lq),
            f"the VolQueueStore of each p2p worker gets {format_bytes(max(0, vol))} (after the "
            f"entries of {vol_count} + {pers_count} waiting messages), less than one largest "
            f"queue message; short by {format_bytes(short)}: raise --memory by at least "
            f"{_mib_more(more)}"
            + (f", or lower --largest-queue-message to {format_bytes(vol)}" if vol > 0 else ""),
        )
    if topic_bytes < lt:
        short = lt - topic_bytes
        more = 2 * short * layout.pubsub * (queues + topics) // topics
        raise WizardError(
            "--largest-topic-message",
            format_bytes(lt),
            f"the topic live buffer of each pubsub worker gets "
            f"{format_bytes(max(0, topic_bytes))} (after the entries of {topic_count} waiting "
            f"messages), less than one largest topic message; short by {format_bytes(short)}: "
            f"raise --memory by at least {_mib_more(more)}"
            + (
                f", or lower --largest-topic-message to {format_bytes(topic_bytes)}"
                if topic_bytes > 0
                else ""
            ),
        )
    rate_entries = math.ceil(inputs.rate_per_s * INDEX_CACHE_SECONDS)
    if entries == SEED_INDEX_CACHE_ENTRIES and rate_entries <= entries:
        entries_why = (
            f"{INDEX_CACHE_SECONDS} s of messages at {inputs.rate_per_s:g} msg/s, at least "
            f"the seed's {SEED_INDEX_CACHE_ENTRIES}"
        )
    elif entries >= rate_entries:
        entries_why = f"{INDEX_CACHE_SECONDS} s of messages at {inputs.rate_per_s:g} msg/s"
    else:
        entries_why = (
            f"what half of the persistent live buffer holds in entries "
            f"({PER_MESSAGE_BYTES} B each); {INDEX_CACHE_SECONDS} s at "
            f"{inputs.rate_per_s:g} msg/s would be {rate_entries}"
        )
    split = f"{queues}:{topics} between queues and topics"
    queue_where = "each p2p worker's live buffers"
    return [
        Choice(
            "store.index_cache_entries",
            entries,
            "the index cache grows with the rate: " + entries_why,
        ),
        Choice(
            "store.index_cache_bytes",
            cache_bytes,
            f"the persistent queue live buffer: 1/17 of what the entries leave of each p2p "
            f"worker's part of the {format_bytes(left)} the budgets have left ({split}), less "
            "the cache's index entries",
        ),
        Choice(
            "queues.max_bytes",
            _kib_floor(vol * 3 // 2),
            "the hard cap above the VolQueueStore high watermark (the default's 24:16)",
        ),
        Choice(
            "vol_queue_store.global_byte_high",
            vol,
            f"the VolQueueStore: 16/17 of what the entries leave of each p2p worker's part of "
            f"the {format_bytes(left)} the budgets have left ({split})",
        ),
        Choice(
            "vol_queue_store.global_byte_low",
            _kib_floor(vol * 15 // 16),
            "15/16 of the high watermark (the seed's 15 MB of 16 MB)",
        ),
        *_count_choices(inputs, "vol_queue_store", vol_count, queue_lowered, queue_where),
        *_count_choices(inputs, "pers_queue_store", pers_count, queue_lowered, queue_where),
        Choice(
            "topics.global_live_byte_high",
            topic_bytes,
            f"the topic live buffer: what the entries leave of each pubsub worker's part of "
            f"the {format_bytes(left)} the budgets have left ({split})",
        ),
        Choice(
            "topics.global_live_byte_low",
            _kib_floor(topic_bytes * 3 // 4),
            "3/4 of the high watermark (the default's 3 MiB of 4 MiB)",
        ),
        *_count_choices(
            inputs, "topics", topic_count, topic_lowered, "each pubsub worker's live buffer"
        ),
    ]


def _check_connections(inputs: WizardInputs, memory: MemoryPlan) -> None:
    each = PER_CONNECTION_BYTES + PER_SUBSCRIPTION_BYTES
    need = inputs.connections * each
    if need <= memory.headroom:
        return
    short = need - memory.headroom
    raise WizardError(
        "--connections",
        str(inputs.connections),
        f"with a subscription each they need {format_bytes(need)} ({format_bytes(each)} each, "
        f"measured), more than the headroom of {format_bytes(memory.headroom)}; short by "
        f"{format_bytes(short)}: raise --memory by at least {_mib_more(2 * short)}"
        f", or lower --connections to {memory.headroom // each}",
    )
