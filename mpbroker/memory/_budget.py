"""The memory budget: what each module may hold, the theoretical maximum, and the estimate.

Pure arithmetic on a `Config`: no processes, no measuring (the measured constants are
below, each with the command that measured it). `plan(config)` gives one `Budget` line per
module -- instances x bytes each = total -- and the fixed cost of the idle processes;
`check(config)` refuses a config whose theoretical maximum (fixed cost + every module's
budget) exceeds `memory.max_memory`; `estimate(...)` is the inverse question, with Qpid's
formula: how much memory N connections, S subscriptions and M messages of B bytes need.

The seed's worked example adds its module defaults up to 46 MB. Ours, for the default
config on a 2-CPU machine (2 gateways, 1 p2p, 1 pubsub and 1 replay worker)::

    socket reader threshold            2 gateways x 64 KiB                        =    128 KiB
    uncommitted transactions           2 gateways x 2 MiB                         =      4 MiB
    storage processing buffer          2 pipelines x 128 KiB                      =    256 KiB
    thread/buffer (rings)              10 rings x (1 MiB + 4 KiB)                 =  10.04 MiB
    worker statistics                  5 workers x 256 KiB                        =   1.25 MiB
    topic live buffers                 1 pubsub worker x (4 MiB + 20000 x 500 B)  =  13.54 MiB
    queue live buffer, persistent      1 p2p worker x (1 MiB + 40000 x 800 B)     =  31.52 MiB
    VolQueueStore (non-persistent)     1 p2p worker x (16 MiB + 60000 x 800 B)    =  61.78 MiB
    destinations                       6432 destinations x 4 KiB                  =  25.12 MiB
    temp store paging step             2 pipelines x 1 MiB                        =      2 MiB
    SQLite page caches                 11 open files x 256 KiB                    =   2.75 MiB
    durable replay                     1 replay worker x 2 MiB                    =      2 MiB
    replay concurrency (thread pools)  4 replays x 256 KiB                        =    (1 MiB)
    module budgets                                                                = 154.37 MiB
    fixed cost                         7 processes (19 MiB + 26 MiB + 2 x 6.5 MiB
                                           + 7 MiB + 7.5 MiB + 4 MiB)             =   76.5 MiB
    theoretical maximum                                                           = 230.87 MiB

against `memory.max_memory` = 256 MiB: 25.13 MiB headroom (10 %) for what the config does not
bound -- connections, subscriptions and their consumer windows (`config estimate`), Python's
garbage between collections. `mpbroker config show` prints this table for any config.

The destinations line is the only one not set by a byte or message count: every queue,
topic with subscribers and durable subscription costs memory while it exists
(`PER_DESTINATION_BYTES`, measured), so `broker.max_destinations` bounds their number, and
by default (0) it is derived: `DESTINATION_SHARE` (half) of what the other lines and the
fixed cost leave of `max_memory` -- 50.26 MiB here, so 6432 destinations and 25.13 MiB of
headroom.

Two thirds of the module budgets are message counts, not bytes: every waiting message keeps
an entry in memory whether its body is in memory, paged to the temp store or only in the
store. A queue message keeps its headers too (selectors read them): its entry costs what a
waiting message costs beyond its body (`PER_MESSAGE_BYTES`); a topic message paged out for
slow subscribers leaves a stub without headers (`PER_ENTRY_BYTES`). So the global counts --
`vol_queue_store.global_msg_high` 60000, `pers_queue_store.global_msg_high` 40000 (the 1000
in the index cache among them), `topics.global_live_msg_high` 20000 -- add 85.83 MiB to the
live buffer lines, which makes the VolQueueStore the largest module, then the persistent
live buffer and the topic live buffers, then the rings. A count set to -1 is bounded per
destination only and left out (its line says so). Both kinds of pipeline page to the temp
store, a step each; every open store file has its own SQLite page cache.

The fixed cost is per role (`FIXED_COST_BYTES`): the supervisor, the fork server with the
pages every worker shares, and each worker's own memory, as measured below.

The rings: every gateway has one to and one from every pipeline, and every pubsub pipeline
one to and one from its replay worker (mpbroker/workers/_layout.py). A ring need not hold a
message: records larger than a quarter of it pass through in fragments. "Thread pools" (the
seed's 4): we have no thread pools; what holds messages concurrently is the durable
replays running at once (`replay.max_concurrent`), whose batches are within
`replay.global_bytes`, so that line is shown (in parentheses) but not added.

A limit is checked before a message is taken, so a module may pass its budget by one
message; the rings bound what is on its way, and the headroom covers the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from mpbroker.config import Config, ConfigError, KiB, MiB, format_bytes
from mpbroker.security import CHECKS_AT_ONCE, HASH_MEMORY_BYTES

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
    "Estimate",
    "MemoryPlan",
    "ProcessCost",
    "check",
    "estimate",
    "max_destinations",
    "plan",
    "process_costs",
    "render_plan",
    "require_fits",
]

# The idle cost of each role, measured with `python -m bench.fixedcost` on 2026-11-23 (2-CPU
# machine, Python 3.11; the default set idles at 74.0 MiB PSS, three runs 73.9-74.0). Workers
# are forked from the fork server (mpbroker/workers/_launcher.py) after it imported their
# modules, so most of a worker's pages are shared: PSS per process shrinks as workers are
# added. The model that fits (1 gateway: 67.9 predicted, 68.5 measured; 4 gateways: 86.5 and
# 86.7): a base -- the supervisor (18.6 MiB) and the fork server with the pages every worker
# shares (25.4 MiB) -- plus each worker's own memory (its USS: gateway 6.2, p2p 6.8, pubsub
# 7.1, replay 3.8 MiB). Rounded up.
FIXED_COST_BYTES: Final[dict[str, int]] = {
    "supervisor": 19 * MiB,
    "fork server": 26 * MiB,
    "gateway": int(6.5 * MiB),
    "p2p": 7 * MiB,
    "pubsub": int(7.5 * MiB),
    "replay": 4 * MiB,
}

# What one more of each costs the broker (the PSS growth of all its processes, per unit),
# measured with `python -m bench.unitcost` on 2026-11-23 (2-CPU machine, Python 3.11, one
# gateway): 1000 idle connections; 2000 subscriptions, half to queues and half to topics,
# windows idle; 20000 non-persistent 100-byte messages waiting in one queue, cost beyond the
# body. Three runs gave 13.9-14.6 KiB, 9.4-9.6 KiB and 769-795 B; rounded up.
PER_CONNECTION_BYTES: Final = 15 * KiB
PER_SUBSCRIPTION_BYTES: Final = 10 * KiB
# A queue message waiting beyond its body: the record, its headers, its place in the queue.
# It is the same whether the body is in memory, paged to the temp store (only the body
# leaves memory) or left in the store beyond the index cache (an index entry): the headers
# stay, selectors read them. tracemalloc, `python -m bench.entrycost` on 2026-11-25
# (Python 3.11, 50000 messages of 1 KB with three headers, each decoded off a Send record,
# one plain queue): paged 680 B, index-only 738 B, in memory 743 B beyond the body (the USS
# growth of the same loops, allocator rounding included: 748, 802-812 and 802-832 B). A
# queue with selector consumers keeps its waiting messages in ordered maps instead: some
# 130 B more each (809 and 867 B), left to the headroom.
PER_MESSAGE_BYTES: Final = 800
# A topic message waiting for a slow subscriber while its pubsub worker pages: a stub with
# neither headers nor body (engine/_topic.py `_stub`), its page's reference count, and its
# place in each backlog (8 B more per further slow subscriber). Measured as above: 434 B
# (USS 463 B); the 303 B of 2026-11-23 were a queue message paged without its headers.
PER_ENTRY_BYTES: Final = 500

# What one destination costs the broker while it exists, with the least that makes it exist:
# a queue holding one message, or a topic with one subscriber, whichever costs more (the
# message or subscription included, so that a producer or a subscriber alone cannot take
# more than the line says). It is its state in the owning pipeline (the queue or the
# topic's subscriber list, its flow tracker entry, its totals row, its deque), its row in
# the snapshot every pipeline publishes every admin.stats_interval_ms (built, encoded, and
# the JSON in the stats spill file in /dev/shm, which MemWatch counts whole), the admin
# thread's reading of that row, and what the gateway remembers of its name. Measured with
# `python -m bench.destinations --queues 10000 --topics 10000 --reference` on 2026-12-08
# (2-CPU machine, Python 3.11, pure Python, one gateway; the PSS growth of every process
# plus /dev/shm, per destination): a queue with one 10-byte message 3284-3635 B of PSS and
# 350 B of spill file, 3635-3969 B in all (its p2p worker 2778-2881 B, of which the message
# is some 700 B; 11865 B in all and 10678 B in the p2p worker before issue 30); a topic
# with one subscriber 3534-3696 B (a subscriber of a topic that exists 2109-2528 B).
# Rounded up.
PER_DESTINATION_BYTES: Final = 4 * KiB
# The share of what max_memory leaves above the fixed cost and the other modules that the
# derived broker.max_destinations takes (the rest stays headroom: connections,
# subscriptions, consumer windows, garbage between collections).
DESTINATION_SHARE: Final = 0.5
# The derived broker.max_destinations is never lower than this.
MIN_DESTINATIONS: Final = 100

# The header page in front of every ring's data area (mpbroker/shm/_ring.py HEADER_BYTES): a
# format constant, not a buffer.
RING_HEADER_BYTES: Final = 4 * KiB


def _plural(count: int, what: str) -> str:
    return f"{count} {what}" if count == 1 else f"{count} {what}s"


@dataclass(frozen=True, slots=True)
class Budget:
    """One module: `count` instances (`unit`s) of `each` bytes, and the settings behind it."""

    module: str
    settings: tuple[str, ...]
    each: int
    count: int
    unit: str  # what one instance is: "gateway", "ring", "p2p worker", ...
    why: str
    # False: shown for the seed's sake but held within another line (not added).
    counted: bool = True
    # False: the config sets no bound on this module (`each` is then meaningless).
    bounded: bool = True
    # How `each` is made up, when it is more than one setting ('1 MiB + 1000 x 768 B').
    each_text: str = ""

    @property
    def total(self) -> int:
        return self.each * self.count

    @property
    def arithmetic(self) -> str:
        """'2 gateways x 64 KiB' (or why there is no number)."""
        if not self.bounded:
            return "unbounded"
        each = self.each_text or format_bytes(self.each)
        if "+" in each:
            each = f"({each})"
        return f"{_plural(self.count, self.unit)} x {each}"


@dataclass(frozen=True, slots=True)
class ProcessCost:
    """The fixed cost of the processes of one role."""

    role: str
    count: int
    each: int

    @property
    def total(self) -> int:
        return self.count * self.each


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """Every module's budget and the fixed cost, against `max_memory`."""

    budgets: tuple[Budget, ...]
    processes: tuple[ProcessCost, ...]
    max_memory: int

    @property
    def budget_total(self) -> int:
        return sum(b.total for b in self.budgets if b.counted and b.bounded)

    @property
    def fixed_cost(self) -> int:
        return sum(p.total for p in self.processes)

    @property
    def process_count(self) -> int:
        return sum(p.count for p in self.processes)

    @property
    def maximum(self) -> int:
        """The theoretical maximum: the fixed cost plus every module's budget."""
        return self.fixed_cost + self.budget_total

    @property
    def headroom(self) -> int:
        """What `max_memory` leaves above the maximum (negative: over)."""
        return self.max_memory - self.maximum

    @property
    def unbounded(self) -> tuple[Budget, ...]:
        return tuple(b for b in self.budgets if not b.bounded)


def largest_message_bytes(config: Config) -> int:
    """The largest message body the config lets in."""
    limit = config.memory.max_message_bytes
    return config.stomp.max_frame_bytes if limit == -1 else limit


def ring_count(config: Config) -> int:
    """Rings of the layout: gateway <-> pipeline both ways, pubsub <-> replay both ways."""
    broker = config.broker
    pipelines = broker.p2p_count() + broker.pubsub_count()
    return 2 * broker.gateway_count() * pipelines + 2 * broker.pubsub_count()


def process_costs(gateways: int, p2p: int, pubsub: int, replay: int) -> tuple[ProcessCost, ...]:
    """The fixed cost of a broker with these workers, by role."""
    counts = {
        "supervisor": 1,
        "fork server": 1,
        "gateway": gateways,
        "p2p": p2p,
        "pubsub": pubsub,
        "replay": replay,
    }
    return tuple(ProcessCost(role, n, FIXED_COST_BYTES[role]) for role, n in counts.items())


def config_process_costs(config: Config) -> tuple[ProcessCost, ...]:
    broker = config.broker
    return process_costs(
        broker.gateway_count(),
        broker.p2p_count(),
        broker.pubsub_count(),
        config.replay.count(broker.pubsub_count()),
    )


def plan(config: Config) -> MemoryPlan:
    """The budget of every module for `config`; see the module docstring."""
    budgets = _module_budgets(config)
    # After the queue live buffers: the destinations, whose default number is derived
    # from what every other module leaves of max_memory.
    at = next(i for i, b in enumerate(budgets) if b.module == "VolQueueStore (non-persistent)")
    budgets.insert(at + 1, _destinations(config, budgets))
    return MemoryPlan(tuple(budgets), config_process_costs(config), config.memory.max_memory)


def max_destinations(config: Config) -> int:
    """`broker.max_destinations` as it applies: the setting, or (0) derived from the
    budget: `DESTINATION_SHARE` of what `max_memory` leaves above the fixed cost and every
    other module's budget, in destinations of `PER_DESTINATION_BYTES` (at least
    `MIN_DESTINATIONS`)."""
    return config.broker.max_destinations or _derived_destinations(config, _module_budgets(config))


def _derived_destinations(config: Config, budgets: list[Budget]) -> int:
    used = sum(p.total for p in config_process_costs(config))
    used += sum(b.total for b in budgets if b.counted and b.bounded)
    room = config.memory.max_memory - used
    return max(MIN_DESTINATIONS, int(room * DESTINATION_SHARE) // PER_DESTINATION_BYTES)


def _destinations(config: Config, budgets: list[Budget]) -> Budget:
    limit = config.broker.max_destinations
    if limit:
        why = "set"
    else:
        limit = _derived_destinations(config, budgets)
        why = (
            f"0: derived, {DESTINATION_SHARE:.0%} of what max_memory leaves above the fixed "
            f"cost and the other modules, at least {MIN_DESTINATIONS}"
        )
    return Budget(
        "destinations",
        ("broker.max_destinations",),
        PER_DESTINATION_BYTES,
        limit,
        "destination",
        f"queues, topics with subscribers and durable subscriptions held at once, over all "
        f"pipelines ({why}); each costs {format_bytes(PER_DESTINATION_BYTES)} with one "
        "message or subscriber (measured: its state in its pipeline, its flow and totals "
        "rows, its row in the published snapshot); one more is refused with an ERROR",
    )


def _module_budgets(config: Config) -> list[Budget]:
    """Every line but the destinations'."""
    broker = config.broker
    gateways = broker.gateway_count()
    p2p, pubsub = broker.p2p_count(), broker.pubsub_count()
    replayers = config.replay.count(pubsub)
    largest = largest_message_bytes(config)
    budgets = [
        Budget(
            "socket reader threshold",
            ("memory.socket_reader_threshold_bytes",),
            config.memory.socket_reader_threshold_bytes,
            gateways,
            "gateway",
            "one socket read buffer per gateway; smaller messages are taken without a memory check",
        ),
        Budget(
            "uncommitted transactions",
            ("transactions.max_uncommitted_bytes",),
            config.transactions.max_uncommitted_bytes,
            gateways,
            "gateway",
            "message bytes in open transactions, over all connections of a gateway",
        ),
        Budget(
            "storage processing buffer",
            ("store.commit_max_bytes",),
            config.store.commit_max_bytes,
            p2p + pubsub,
            "pipeline",
            "the group-commit batch of each p2p and pubsub worker",
        ),
        Budget(
            "thread/buffer (rings)",
            ("rings.capacity_bytes",),
            config.rings.capacity_bytes + RING_HEADER_BYTES,
            ring_count(config),
            "ring",
            f"each of {_plural(gateways, 'gateway')} to and from each of "
            f"{_plural(p2p + pubsub, 'pipeline')}, and each of {_plural(pubsub, 'pubsub worker')} "
            "to and from its replay worker; "
            f"{format_bytes(RING_HEADER_BYTES)} header page each",
            each_text=f"{format_bytes(config.rings.capacity_bytes)} + "
            f"{format_bytes(RING_HEADER_BYTES)}",
        ),
        Budget(
            "worker statistics",
            ("admin.stats_bytes",),
            config.admin.stats_bytes,
            gateways + p2p + pubsub + replayers,
            "worker",
            "each worker's published state, read by the admin API",
        ),
        _topic_live(config, pubsub, largest),
        _persistent_queue(config, p2p),
        _vol_queue(config, p2p),
    ]
    if config.temp_store.limit_bytes != -1:
        budgets.append(
            Budget(
                "temp store paging step",
                ("temp_store.page_step_bytes",),
                config.temp_store.page_step_bytes,
                p2p + pubsub,
                "pipeline",
                "messages being paged out to the temp store at once",
            )
        )
    budgets.append(
        Budget(
            "SQLite page caches",
            ("store.sqlite_cache_bytes",),
            config.store.sqlite_cache_bytes,
            _open_store_files(config),
            "open file",
            "per pipeline its active store segment, one being read, its temp store's active "
            "file and one being read (plus the durable registry of a pubsub worker); per "
            "replay worker the registry and a segment of each partition it serves. A backlog "
            "spread over more segments opens more files; a file's cache holds only pages read",
        )
    )
    if config.security.users_file:
        budgets.append(
            Budget(
                "password checks",
                ("security.users_file",),
                CHECKS_AT_ONCE * HASH_MEMORY_BYTES,
                gateways + (1 if config.admin.port >= 0 else 0),
                "checker",
                f"{CHECKS_AT_ONCE} scrypt check at a time in each gateway (and the admin API), "
                f"{format_bytes(HASH_MEMORY_BYTES)} while it runs",
                each_text=f"{CHECKS_AT_ONCE} x {format_bytes(HASH_MEMORY_BYTES)}",
            )
        )
    budgets += _replay(config, replayers, largest)
    return budgets


def _entries(high: int, setting: str, each: int, what: str, where: str) -> tuple[int, str, str]:
    """The entries of up to `high` waiting messages of `each` bytes (bytes, arithmetic,
    why); nothing when the count is off."""
    if high == -1:
        return 0, "", f"; messages are counted per destination only (set {setting} to count them)"
    return (
        high * each,
        f" + {high} x {each} B",
        f"; up to {high} waiting messages ({setting}) keep {what} in memory "
        f"({each} B each, measured), {where}",
    )


def _topic_live(config: Config, pubsub: int, largest: int) -> Budget:
    topics = config.topics
    module = "topic live buffers"
    paging = config.temp_store.limit_bytes != -1
    if topics.global_live_byte_high != -1:
        entries, entries_text, entries_why = _entries(
            topics.global_live_msg_high,
            "topics.global_live_msg_high",
            PER_ENTRY_BYTES,
            "an entry",
            "their bodies and headers in memory or paged to disk",
        )
        settings = ("topics.global_live_byte_high", "topics.global_live_msg_high")
        return Budget(
            module,
            settings if entries else settings[:1],
            topics.global_live_byte_high + entries,
            pubsub,
            "pubsub worker",
            "message bytes waiting for slow subscribers (counted once per subscriber) "
            + (
                "past which they are paged to the temp store"
                if paging
                else "that stop every publisher"
            )
            + entries_why,
            each_text=format_bytes(topics.global_live_byte_high) + entries_text,
        )
    if topics.global_live_msg_high != -1:
        return Budget(
            module,
            ("topics.global_live_msg_high", "memory.max_message_bytes"),
            topics.global_live_msg_high * largest,
            pubsub,
            "pubsub worker",
            "topics.global_live_byte_high is off: messages waiting for slow subscribers x "
            "the largest message",
            each_text=f"{topics.global_live_msg_high} x {format_bytes(largest)}",
        )
    return Budget(
        module,
        ("topics.global_live_byte_high", "topics.global_live_msg_high"),
        0,
        pubsub,
        "pubsub worker",
        "both are -1: nothing bounds what waits for slow topic subscribers",
        bounded=False,
    )


def _persistent_queue(config: Config, p2p: int) -> Budget:
    """The index cache's bodies, and the entry and headers of every waiting stored message
    (`PER_MESSAGE_BYTES`, cached or not): as many as the store's global count lets wait,
    at least the cache's."""
    store = config.store
    cached = store.index_cache_entries
    high = config.pers_queue_store.global_msg_high
    bodies = f"bodies of the first {cached} waiting stored messages"
    each = f"({PER_MESSAGE_BYTES} B each, measured)"
    if high > cached:
        entries = high
        settings = ("store.index_cache_bytes", "pers_queue_store.global_msg_high")
        why = (
            f"{bodies}; up to {high} waiting stored messages (pers_queue_store.global_msg_high) "
            f"keep their entry and headers in memory {each}, those beyond the cache with "
            "their bodies in the store"
        )
    else:
        entries = cached
        settings = ("store.index_cache_bytes", "store.index_cache_entries")
        why = f"{bodies}, and their entries and headers {each}"
        if high == -1:
            why += (
                "; those beyond the cache are counted per destination only (set "
                "pers_queue_store.global_msg_high to count them)"
            )
    return Budget(
        "queue live buffer, persistent",
        settings,
        store.index_cache_bytes + entries * PER_MESSAGE_BYTES,
        p2p,
        "p2p worker",
        why,
        each_text=f"{format_bytes(store.index_cache_bytes)} + {entries} x {PER_MESSAGE_BYTES} B",
    )


def _vol_queue(config: Config, p2p: int) -> Budget:
    vol = config.vol_queue_store
    paging = config.temp_store.limit_bytes != -1
    if vol.global_byte_high != -1:
        settings = ["vol_queue_store.global_byte_high"]
        each = vol.global_byte_high
        why = "non-persistent message bytes in memory " + (
            "past which they are paged to the temp store" if paging else "that stop every producer"
        )
    else:
        settings = ["queues.max_bytes"]
        each = config.queues.max_bytes
        why = "vol_queue_store.global_byte_high is off: the hard queues.max_bytes bounds them"
    entries, entries_text, entries_why = _entries(
        vol.global_msg_high,
        "vol_queue_store.global_msg_high",
        PER_MESSAGE_BYTES,
        "their entry and headers",
        "their bodies in memory or paged to disk",
    )
    if entries:
        settings.append("vol_queue_store.global_msg_high")
    return Budget(
        "VolQueueStore (non-persistent)",
        tuple(settings),
        each + entries,
        p2p,
        "p2p worker",
        why + entries_why,
        each_text=format_bytes(each) + entries_text,
    )


def _replay(config: Config, replayers: int, largest: int) -> list[Budget]:
    replay = config.replay
    # Each replay worker gets an even share of replay.global_bytes (at least one batch,
    # mpbroker/workers/replay.py), and a message larger than that is replayed alone.
    share = max(replay.replay_bytes, replay.global_bytes // replayers)
    each = max(share, largest)
    why = "replayed message bytes in flight, shared out among the replay workers"
    if largest > share:
        why += f"; at least the largest message ({format_bytes(largest)}), replayed alone"
    return [
        Budget(
            "durable replay",
            ("replay.global_bytes",),
            each,
            replayers,
            "replay worker",
            why,
        ),
        Budget(
            "replay concurrency (thread pools)",
            ("replay.max_concurrent", "replay.replay_bytes"),
            replay.replay_bytes,
            replay.max_concurrent,
            "replay",
            "durable subscribers replaying at once, a batch each; within durable replay "
            "(not added)",
            counted=False,
        ),
    ]


def _open_store_files(config: Config) -> int:
    broker = config.broker
    return (
        4 * (broker.p2p_count() + broker.pubsub_count())
        + broker.pubsub_count()
        + (2 * broker.pubsub_count())
    )


def _fixed_text(memory: MemoryPlan) -> str:
    return ", ".join(
        f"{p.role} {format_bytes(p.each)}"
        if p.count == 1
        else f"{p.count} x {p.role} {format_bytes(p.each)}"
        for p in memory.processes
        if p.count
    )


def check(config: Config) -> str | None:
    """Why `config` cannot run within `memory.max_memory` (None: it fits).

    Names the modules that make up the excess (the largest first), their totals, the excess
    and what to lower.
    """
    memory = plan(config)
    open_ended = memory.unbounded
    if open_ended:
        names = "; ".join(f"{b.module}: {' and '.join(b.settings)} ({b.why})" for b in open_ended)
        return (
            f"the theoretical maximum cannot be computed: {names}; set a byte limit so the "
            "broker's memory stays within memory.max_memory"
        )
    excess = -memory.headroom
    if excess <= 0:
        return None
    # The largest modules that, lowered to nothing, would cover the excess.
    culprits: list[Budget] = []
    covered = 0
    for budget in sorted(
        (b for b in memory.budgets if b.counted), key=lambda b: b.total, reverse=True
    ):
        if covered >= excess:
            break
        culprits.append(budget)
        covered += budget.total
    listed = "; ".join(
        f"{b.module} {format_bytes(b.total)} ({b.arithmetic}: {', '.join(b.settings)})"
        for b in culprits
    )
    lower = ", ".join(dict.fromkeys(s for b in culprits for s in b.settings))
    return (
        f"the theoretical maximum {format_bytes(memory.maximum)} (fixed cost "
        f"{format_bytes(memory.fixed_cost)} of {memory.process_count} processes + module "
        f"budgets {format_bytes(memory.budget_total)}) exceeds memory.max_memory = "
        f"{format_bytes(memory.max_memory)} by {format_bytes(excess)}. Largest modules: "
        f"{listed}. Lower {lower} (or the number of processes), or raise memory.max_memory "
        f"to at least {format_bytes(memory.maximum)}; `mpbroker config show` lists every "
        "budget"
    )


def require_fits(config: Config) -> None:
    """ConfigError (key memory.max_memory) with `check`'s explanation, unless it fits."""
    problem = check(config)
    if problem is not None:
        raise ConfigError("memory.max_memory", config.memory.max_memory, problem)


def render_plan(memory: MemoryPlan) -> list[str]:
    """The budget table as text lines (`config show` prints them as TOML comments)."""
    width = max(len(b.module) for b in memory.budgets)
    arith = max(len(b.arithmetic) for b in memory.budgets)

    def row(label: str, arithmetic: str, total: str, note: str = "") -> str:
        line = f"{label:<{width}}  {arithmetic:<{arith}}  {total:>10}"
        return f"{line}  {note}".rstrip()

    lines = [
        "Memory budget: the most each module can hold (instances x each, total)",
        row("module", "instances x each", "total", "settings"),
    ]
    for b in memory.budgets:
        total = format_bytes(b.total) if b.bounded else "unbounded"
        if not b.counted:
            total = f"({total})"
        lines.append(row(b.module, b.arithmetic, total, ", ".join(b.settings)))
        lines.append(f"    {b.why}")
    lines += [
        row("module budgets", "", format_bytes(memory.budget_total)),
        row(
            "fixed cost",
            f"{memory.process_count} idle processes",
            format_bytes(memory.fixed_cost),
            _fixed_text(memory) + " (measured: python -m bench.fixedcost)",
        ),
        row("theoretical maximum", "", format_bytes(memory.maximum)),
        row("memory.max_memory", "", format_bytes(memory.max_memory)),
    ]
    if memory.unbounded:
        lines.append(row("headroom", "", "unknown", "a module is unbounded: refused at start"))
    elif memory.headroom >= 0:
        share = 100 * memory.headroom / memory.max_memory
        lines.append(
            row(
                "headroom",
                "",
                format_bytes(memory.headroom),
                f"{share:.0f} % for connections, subscriptions (mpbroker config estimate)",
            )
        )
    else:
        lines.append(
            row("over by", "", format_bytes(-memory.headroom), "refused at start (mpbroker serve)")
        )
    lines.append(
        "Not in the maximum (per connection or subscription, unbounded by the config): "
        "consumer windows (queues.prefetch, topics.prefetch, flow.consumer_window_bytes); "
        "see mpbroker config estimate"
    )
    return lines


@dataclass(frozen=True, slots=True)
class Estimate:
    """Qpid's formula with our measured costs: fixed cost + N x per connection + S x per
    subscription + M x (per message + B)."""

    terms: tuple[tuple[str, int], ...]
    max_memory: int
    messages: int
    message_bytes: int
    # The VolQueueStore bytes of all p2p workers (where M messages wait when not consumed).
    queue_budget: int
    # The most one subscription's consumer window holds of such messages.
    window_bytes: int
    # The destinations asked about, and how many the config lets exist.
    destinations: int = 0
    max_destinations: int = 0

    @property
    def total(self) -> int:
        return sum(n for _, n in self.terms)

    def lines(self) -> list[str]:
        width = max(len(label) for label, _ in self.terms)
        out = [f"{label:<{width}}  {format_bytes(n):>10}" for label, n in self.terms]
        out.append(f"{'total':<{width}}  {format_bytes(self.total):>10}")
        verdict = (
            f"fits: {100 * self.total / self.max_memory:.0f} % of"
            if self.total <= self.max_memory
            else f"over by {format_bytes(self.total - self.max_memory)}:"
        )
        out.append(f"{verdict} memory.max_memory = {format_bytes(self.max_memory)}")
        bodies = self.messages * self.message_bytes
        line = (
            f"their bodies ({format_bytes(bodies)}) fit in the VolQueueStore budgets "
            f"({format_bytes(self.queue_budget)} over all p2p workers)"
        )
        if bodies > self.queue_budget:
            line = (
                line.replace(" fit in ", " exceed ")
                + ": non-persistent producers are stopped there; persistent bodies beyond the "
                "index cache wait on disk"
            )
        out.append(line)
        out.append(
            f"consumer windows: each session may have up to {format_bytes(self.window_bytes)} "
            "delivered and not yet acknowledged (prefetch x message size, at most "
            "flow.consumer_window_bytes); those messages are among the M above"
        )
        fits = "fit within" if self.destinations <= self.max_destinations else "exceed"
        out.append(
            f"destinations: {self.destinations} {fits} broker.max_destinations "
            f"{self.max_destinations} (the budget's line: {self.max_destinations} x "
            f"{format_bytes(PER_DESTINATION_BYTES)}); more are refused with an ERROR"
        )
        return out


def estimate(
    config: Config,
    connections: int,
    sessions: int,
    messages: int,
    message_bytes: int,
    destinations: int = 0,
) -> Estimate:
    """How much memory `connections` connections, `sessions` subscriptions (sessions),
    `messages` waiting messages of `message_bytes` bytes and `destinations` destinations
    (queues, topics with subscribers, durable subscriptions) need, by the measured unit
    costs."""
    for name, value in (
        ("connections", connections),
        ("sessions", sessions),
        ("messages", messages),
        ("message_bytes", message_bytes),
        ("destinations", destinations),
    ):
        if value < 0:
            raise ValueError(f"{name} = {value}: must be >= 0")
    processes = config_process_costs(config)
    count = sum(p.count for p in processes)
    terms: list[tuple[str, int]] = [
        (f"fixed cost ({count} idle processes)", sum(p.total for p in processes)),
        (
            f"{connections} connections x {format_bytes(PER_CONNECTION_BYTES)}",
            connections * PER_CONNECTION_BYTES,
        ),
        (
            f"{sessions} sessions x {format_bytes(PER_SUBSCRIPTION_BYTES)}",
            sessions * PER_SUBSCRIPTION_BYTES,
        ),
        (
            f"{messages} messages x ({PER_MESSAGE_BYTES} B + {format_bytes(message_bytes)})",
            messages * (PER_MESSAGE_BYTES + message_bytes),
        ),
        (
            f"{destinations} destinations x {format_bytes(PER_DESTINATION_BYTES)}",
            destinations * PER_DESTINATION_BYTES,
        ),
    ]
    vol = config.vol_queue_store.global_byte_high
    queue_budget = (vol if vol != -1 else config.queues.max_bytes) * config.broker.p2p_count()
    prefetch = max(config.queues.prefetch, config.topics.prefetch)
    window = prefetch * (PER_MESSAGE_BYTES + message_bytes)
    if config.flow.consumer_window_bytes != -1:
        window = min(window, config.flow.consumer_window_bytes)
    return Estimate(
        tuple(terms),
        config.memory.max_memory,
        messages,
        message_bytes,
        queue_budget,
        window,
        destinations,
        max_destinations(config),
    )
