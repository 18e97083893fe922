"""The settings: every section with its defaults, units and allowed ranges, and `Config`.

Pure data: no files, no sockets. Every setting has a default, so no file is needed; each
field carries its documentation and allowed range in its metadata (`_setting`), which
loading (`_load`) checks and `mpbroker config show` prints. Every limit carries its unit
in its name (`max_frame_bytes`, `send_timeout_ms`).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import os
from dataclasses import dataclass, field
from typing import Any, Final

from ._units import GiB, KiB, MiB

__all__ = [
    "DEFAULT_QUOTA",
    "DESTINATION_KEYS",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "AdminSettings",
    "BrokerSettings",
    "CompressionSettings",
    "Config",
    "DestinationSettings",
    "FlowSettings",
    "MemorySettings",
    "QueueSettings",
    "QuotaConfig",
    "ReplaySettings",
    "RingSettings",
    "SecuritySettings",
    "SelectorSettings",
    "StompSettings",
    "StoreFlowSettings",
    "StoreSettings",
    "TempStoreSettings",
    "TopicSettings",
    "TransactionSettings",
    "section_defaults",
    "sections",
]

LOG_LEVELS: Final = ("debug", "info", "warning", "error")
LOG_FORMATS: Final = ("auto", "text", "journal")


def _setting(
    default: Any,
    doc: str,
    *,
    min: float | None = None,
    max: float | None = None,
    choices: tuple[str, ...] | None = None,
    size: bool = False,
    share: bool = False,
) -> Any:
    """A dataclass field that carries its documentation and its allowed range (`size`: an
    integer that also takes a size string such as '16MiB', as `*_bytes` settings do;
    `share`: a text that is a size or a share such as '5%', and takes an integer too)."""
    metadata = {"doc": doc, "min": min, "max": max, "choices": choices, "size": size}
    metadata["share"] = share
    return field(default=default, metadata=metadata)


def _watermark(default: int, doc: str) -> Any:
    return _setting(default, doc + " (-1 = off)", min=-1, size=True)


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    host: str = _setting("127.0.0.1", "address the STOMP listener binds to")
    port: int = _setting(61613, "STOMP port; 0 picks a free one", min=0, max=65535)
    data_dir: str = _setting("mpbroker-data", "directory for stores and runtime files")
    gateways: int = _setting(
        0, "gateway worker processes; 0 = one per usable CPU (as many as fit)", min=0, max=256
    )
    # Queues and topics are partitioned over the pipelines by a hash of their names, so the
    # count a data dir was made with is kept (workers/datadir.py).
    p2p_workers: int = _setting(
        1,
        "point-to-point (queue) pipeline processes; 0 = one per usable CPU (as many as fit), "
        "or the count the data dir was made with",
        min=0,
        max=64,
    )
    pubsub_workers: int = _setting(
        1,
        "publish/subscribe (topic) pipeline processes; 0 = one per usable CPU (as many as "
        "fit), or the count the data dir was made with",
        min=0,
        max=64,
    )
    # ActiveMQ's transportConnector default maximumConnections is 1000; a gateway is
    # cheap per idle connection (one trio task pair), so allow more by default.
    max_connections: int = _setting(
        10000, "client connections accepted at once, over all gateways", min=1
    )
    # Loopback clients all come from one address, so there is no default limit; set one
    # on a broker that listens on the network.
    max_connections_per_address: int = _setting(
        0, "client connections accepted at once from one IP address (0 = no limit)", min=0
    )
    # Sockets that have not completed CONNECT (and authentication) cost little to open and
    # hold. Their own limit, kept below max_connections (`connecting_limit`), and closing
    # the oldest of them to make room (as nginx closes its idle connections when it runs
    # out) keep them from taking max_connections from real clients.
    max_connections_connecting: int = _setting(
        1000,
        "connections that have not completed CONNECT, over all gateways (at most half of "
        "max_connections); past it the oldest of them is closed to make room",
        min=1,
    )
    # Every destination costs memory while it exists (its state, index, flow and stats
    # rows: memory.PER_DESTINATION_BYTES), so their number is bounded like the rest of the
    # memory budget; a SEND or SUBSCRIBE that would make one more gets an ERROR.
    max_destinations: int = _setting(
        0,
        "queues, topics with subscribers and durable subscriptions held at once, over all "
        "pipelines; one more is refused (0 = derived from memory.max_memory: half of what "
        "the memory budget leaves)",
        min=0,
    )
    shutdown_timeout_ms: int = _setting(
        10000, "how long SIGTERM waits for workers before killing them", min=0
    )
    # Workers beat at least every rings.park_timeout_ms when idle and after every batch
    # when busy; a long silence means a hung process (a deadlock, a stuck system call).
    worker_stall_timeout_ms: int = _setting(
        15000,
        "a worker whose heartbeat is older than this is killed and restarted (0 = off)",
        min=0,
    )
    restart_backoff_max_ms: int = _setting(
        5000, "longest wait before restarting a worker that keeps crashing", min=0
    )
    log_level: str = _setting("info", "log level", choices=LOG_LEVELS)
    log_format: str = _setting(
        "auto",
        "text: lines with their time; journal: <N> priority prefixes and no time, for "
        "journald; auto: journal when stderr is the journal ($JOURNAL_STREAM), else text",
        choices=LOG_FORMATS,
    )

    # The broker resolves every 0 before it starts (`mpbroker.memory.fit_workers`, which
    # knows the usable CPUs and the data dir's partitions); these are for budgets computed
    # on a config that was not resolved, and assume every online CPU.
    def gateway_count(self) -> int:
        """Gateways (0 means one per CPU)."""
        return self.gateways or (os.cpu_count() or 1)

    def p2p_count(self) -> int:
        """p2p workers (0 means one per CPU)."""
        return self.p2p_workers or (os.cpu_count() or 1)

    def pubsub_count(self) -> int:
        """pubsub workers (0 means one per CPU)."""
        return self.pubsub_workers or (os.cpu_count() or 1)

    def connecting_limit(self) -> int:
        """The limit on connections that have not completed CONNECT that holds:
        `max_connections_connecting`, but at most half of `max_connections` (at least 1),
        so that it is below max_connections whatever the two settings say (a default
        config is valid for any max_connections)."""
        return max(1, min(self.max_connections_connecting, self.max_connections // 2))


@dataclass(frozen=True, slots=True)
class StompSettings:
    # ActiveMQ's StompWireFormat caps data at 100 MiB, RabbitMQ's STOMP plugin frames at
    # a few MiB. Rings need not hold a frame (large records go through them in fragments).
    max_frame_bytes: int = _setting(
        1 * MiB, "largest frame (headers and body) a client may send", min=256
    )
    max_headers: int = _setting(1000, "most headers in one frame (ActiveMQ: 1000)", min=1)
    max_header_bytes: int = _setting(10 * KiB, "longest header line (ActiveMQ: 10 KiB)", min=64)
    connect_timeout_ms: int = _setting(10000, "time a new connection has to send CONNECT", min=1)
    # Slowloris: a client that trickles a frame a byte at a time keeps heart-beating by it
    # and would hold its connection (and its buffer) for ever.
    frame_timeout_ms: int = _setting(
        30000, "time a frame that has started has to complete (0 = no limit)", min=0
    )
    # STOMP over TLS: a second listener on every gateway, beside the plain port (which
    # stays; bind it to loopback when only TLS may come from outside).
    tls_port: int = _setting(
        -1, "STOMP over TLS port; -1 = no TLS listener, 0 picks a free one", min=-1, max=65535
    )
    # STOMP over WebSocket (browsers, stomp.js): the same sessions, one frame a message.
    ws_port: int = _setting(
        -1,
        "STOMP over WebSocket port (path /stomp or /ws); -1 = none, 0 picks a free one",
        min=-1,
        max=65535,
    )
    wss_port: int = _setting(
        -1,
        "STOMP over WebSocket over TLS port (the tls_* files); -1 = none, 0 picks a free one",
        min=-1,
        max=65535,
    )
    # Cross-site WebSocket hijacking: any page a user opens may connect to the broker.
    ws_allowed_origins: str = _setting(
        "",
        "origins (https://app.example.com, comma-separated; * = any) whose pages may use "
        "the WebSocket ports, besides localhost, 127.0.0.1 and ::1",
    )
    tls_cert_file: str = _setting("", "the TLS listener's certificate chain (PEM)")
    tls_key_file: str = _setting("", "the private key of tls_cert_file (PEM)")
    tls_ca_file: str = _setting(
        "", 'CA certificates (PEM) client certificates are checked against; "" = none'
    )
    tls_require_client_cert: bool = _setting(
        False, "a TLS client must present a certificate signed by tls_ca_file"
    )
    # The server's heart-beat offer (cx, cy in CONNECTED): the shortest intervals it
    # agrees to send and to expect. 0 switches that direction off.
    heartbeat_send_ms: int = _setting(1000, "shortest interval the broker sends heart-beats", min=0)
    heartbeat_receive_ms: int = _setting(
        1000, "shortest interval the broker asks clients to send heart-beats", min=0
    )
    heartbeat_grace: float = _setting(
        2.0,
        "a client is dropped after grace x its negotiated heart-beat interval of silence",
        min=1.0,
    )


@dataclass(frozen=True, slots=True)
class RingSettings:
    # Measured (issue 5): the smallest size that keeps >= 90 % of the throughput of 2 MiB
    # rings with 1 KB and 100 KB messages; 256 KiB (the seed's budget) loses half of it
    # with 100 KB messages. Messages larger than a quarter of it pass in fragments.
    capacity_bytes: int = _setting(
        1 * MiB,
        "bytes of each shared-memory ring between a gateway and a pipeline (power of two)",
        min=4096,
    )
    batch_records: int = _setting(512, "most records a worker takes from one ring at a time", min=1)
    park_timeout_ms: int = _setting(
        100, "backstop wake-up of an idle worker waiting on its doorbell", min=1, max=10000
    )


@dataclass(frozen=True, slots=True)
class QueueSettings:
    # ActiveMQ's default queue prefetch is 1000.
    prefetch: int = _setting(
        1000, "default window of unacknowledged deliveries per queue subscription", min=1
    )
    max_messages: int = _setting(
        100000,
        "most messages one queue holds (waiting, or delivered and not yet acknowledged)",
        min=1,
    )
    # A hard cap above vol_queue_store.global_byte_high: flow control stops producers
    # first; this only refuses what was already on its way when they stopped.
    max_bytes: int = _setting(
        24 * MiB,
        "most bytes of non-persistent messages all queues of one p2p worker hold in memory "
        "(the VolQueueStore); past it a SEND is refused",
        min=1,
    )
    # ActiveMQ's RedeliveryPolicy default.
    max_redeliveries: int = _setting(
        6,
        "a message returned more often than this goes to the dead-letter queue (-1 = never)",
        min=-1,
    )
    dead_letter_prefix: str = _setting(
        "DLQ.", "dead letters of /queue/NAME go to /queue/<prefix>NAME"
    )
    expiry_on_read: bool = _setting(
        True, "drop expired messages met while dispatching, without waiting for the scan"
    )
    expiry_scan_interval_s: float = _setting(
        30.0, "how often queues are scanned for expired messages (0 = only on read)", min=0.0
    )
    # WebLogic's expiration policies.
    expiry_policy: str = _setting(
        "discard",
        "what happens to an expired message: discard, log (one line each), or redirect "
        "(to expiry_destination)",
        choices=("discard", "log", "redirect"),
    )
    expiry_log_fields: str = _setting(
        "%header%,%properties%",
        "what the log policy writes: %header%, %properties%, or field and property names",
    )
    expiry_destination: str = _setting(
        "", "where the redirect policy moves expired messages ('' = the queue's dead-letter queue)"
    )


@dataclass(frozen=True, slots=True)
class TopicSettings:
    # ActiveMQ's topic prefetch is 32766; ours is smaller because a gateway buffers what
    # a slow subscriber has not read yet.
    prefetch: int = _setting(
        1000, "default window of undelivered/unacknowledged messages per topic subscription", min=1
    )
    max_pending_messages: int = _setting(
        10000,
        "most messages waiting for one slow topic subscriber; past it a publish is refused",
        min=1,
    )
    # The topic live buffer's watermarks: a slow subscriber stops its topic's publishers
    # (flow control) long before the refusal above.
    live_msg_high: int = _watermark(
        5000, "messages waiting for a topic's slowest subscriber that stop its publishers"
    )
    live_msg_low: int = _watermark(4000, "...and that let them go again")
    global_live_msg_high: int = _watermark(
        20000,
        "messages waiting for slow subscribers over all topics of one pubsub worker that "
        "stop every publisher",
    )
    global_live_msg_low: int = _watermark(15000, "...and that let them go again")
    # The seed's topic live buffer budget is 1 MB, counting each message once; ours counts
    # a message once per subscriber still waiting for it, so allow a few times more.
    global_live_byte_high: int = _watermark(
        4 * MiB,
        "message bytes waiting for slow subscribers over all topics of one pubsub worker "
        "(counted per subscriber) that stop every publisher",
    )
    global_live_byte_low: int = _watermark(3 * MiB, "...and that let them go again")


@dataclass(frozen=True, slots=True)
class TransactionSettings:
    # The seed's "uncommitted transactions" module budget.
    max_uncommitted_bytes: int = _setting(
        2 * MiB,
        "message bytes held in open transactions, over all connections of one gateway",
        min=1,
    )
    # iBus's transaction manager bounds each connection too, so one connection's big
    # transaction need not cost another its small one (issue 14). -1 keeps the old
    # behaviour, one connection may use the whole total, and follows the total when it is
    # changed (a fixed default would have to be changed with it).
    max_uncommitted_bytes_per_connection: int = _setting(
        -1,
        "message bytes one connection may hold in its open transactions "
        "(-1 = up to max_uncommitted_bytes)",
        min=-1,
        size=True,
    )
    # iBus's txmemsizereducestategy (MAXBYTES, MAXMESSAGES, OLDESTTX, YOUNGESTTX, ALL, NONE).
    reduce_strategy: str = _setting(
        "max_bytes",
        "which open transactions of other connections are discarded (ERROR, connection "
        "closed) when a SEND would pass max_uncommitted_bytes; none refuses that SEND",
        choices=("max_bytes", "max_messages", "oldest_tx", "youngest_tx", "all", "none"),
    )
    timeout_ms: int = _setting(
        0,
        "a transaction open longer than this is rolled back and its connection closed "
        "with an ERROR (0 = never)",
        min=0,
    )
    max_open_per_connection: int = _setting(
        100, "transactions one connection may have open at once", min=1
    )


@dataclass(frozen=True, slots=True)
class SelectorSettings:
    """JMS message selectors on SUBSCRIBE (docs/selectors.md)."""

    # ActiveMQ and Artemis set no limit; a selector is compiled once per subscription and
    # its text kept with it (and stored with a durable one), so a bound keeps a client
    # from handing the broker megabytes of it.
    max_length: int = _setting(
        4 * KiB, "longest selector a SUBSCRIBE may carry, in characters", min=1
    )


@dataclass(frozen=True, slots=True)
class StoreSettings:
    """Persistent messages: segmented SQLite WAL stores, one directory per partition."""

    # The size of an ActiveMQ KahaDB journal file.
    segment_max_bytes: int = _setting(
        32 * MiB, "a store's active segment file is sealed past this size", min=64 * KiB
    )
    segment_max_age_s: float = _setting(
        3600.0, "...or when it is this old (0 = never by age)", min=0.0
    )
    archive: bool = _setting(
        False, "retired segments are moved to <store>/archive instead of deleted"
    )
    synchronous: str = _setting(
        "full",
        "full: no acknowledged message lost on power loss; "
        "normal: survives process crashes, not power loss",
        choices=("full", "normal"),
    )
    group_commit: bool = _setting(
        True, "batch persistent sends into one transaction (off: one commit per message)"
    )
    commit_max_delay_ms: int = _setting(
        5, "a batch is committed at the latest this long after its first message", min=0
    )
    # The seed's default is 5; under load the delay above is what should end a batch
    # (each commit is an fsync with synchronous = full), so allow many messages per commit.
    commit_max_messages: int = _setting(
        256, "a batch is committed once it holds this many messages", min=1
    )
    commit_max_bytes: int = _setting(
        128 * KiB, "a batch is committed once it holds this many bytes", min=1
    )
    # The seed's IndexCache default.
    index_cache_entries: int = _setting(
        1000,
        "stored messages waiting in one p2p worker's queues that keep their body in memory; "
        "the others keep only an index entry and are read back when delivered",
        min=1,
    )
    # The seed's queue live buffer for persistent messages.
    index_cache_bytes: int = _setting(
        1 * MiB,
        "...and the most body bytes those cached messages may hold together",
        min=0,
        size=True,
    )
    # RabbitMQ's disk_free_limit (its default is 50 MB): persistent producers stop before the
    # filesystem is full, so that consumers can always drain. Producers stop that much plus
    # a margin (pipeline.DiskWatch, flow.append_margin): what the stores may write between
    # two readings of the free space.
    disk_free_limit_bytes: str = _setting(
        "64MiB",
        "free space the stores never take their filesystem below: persistent producers "
        "stop (flow control) with a margin above it for what the stores may write between "
        "two readings, read before every store append; a size, or a share of the "
        "filesystem such as '5%'; 0 = off",
        share=True,
    )
    # What a full filesystem leaves an acknowledgement: RabbitMQ and ActiveMQ only stop
    # producers early; a file given back when the filesystem is full also lets draining
    # and the next start write what they need (docs/persistence.md, "A full disk").
    disk_reserve_bytes: int = _setting(
        4 * MiB,
        "space each store holds back (a file in its directory) and gives up when the "
        "filesystem is full, so acknowledgements are stored and draining frees space; 0 = none",
        min=0,
        size=True,
    )
    # SQLite's own default is 2000 KiB per connection, and a store keeps one connection
    # per segment file it reads: that is memory the budget must see.
    sqlite_cache_bytes: int = _setting(
        256 * KiB,
        "SQLite page cache of each open store file (segments, registry, temp store)",
        min=4096,
        size=True,
    )
    cleanup_batch: int = _setting(
        500, "most expired messages settled in one store transaction", min=1
    )
    cleanup_gap_ms: int = _setting(
        10, "pause between two cleanup transactions, so cleanup never stalls delivery", min=0
    )


@dataclass(frozen=True, slots=True)
class ReplaySettings:
    """Durable subscribers coming back: their stored backlog is read by replay workers."""

    workers: int = _setting(
        1,
        "replay worker processes (each serves the pubsub partitions p with p % workers); 0 = "
        "one per usable CPU, at most one per pubsub worker (as many as fit)",
        min=0,
    )
    replay_messages: int = _setting(100, "most messages in one replay batch", min=1)
    replay_bytes: int = _setting(256 * KiB, "most message bytes in one replay batch", min=1)
    max_concurrent: int = _setting(
        4, "durable subscribers replaying at once (the others wait their turn)", min=1
    )
    # A single message larger than this is still replayed, alone.
    global_bytes: int = _setting(
        2 * MiB, "most replayed message bytes in flight over all subscribers", min=1
    )

    def count(self, pubsub: int) -> int:
        """Replay workers for `pubsub` pubsub workers (0 means one per CPU, at most one per
        pubsub worker: a replay worker serves whole pubsub partitions)."""
        return self.workers or min(pubsub, os.cpu_count() or 1)


@dataclass(frozen=True, slots=True)
class FlowSettings:
    """What a producer sees when a limit stops it (docs/architecture.md, "Flow control")."""

    # WebLogic's Send Timeout.
    send_timeout_ms: int = _setting(
        10000,
        "a SEND to a stopped destination waits this long for room, then gets an ERROR "
        "naming the limit (0 = refuse at once)",
        min=0,
    )
    # The message window is queues.prefetch / topics.prefetch (the SUBSCRIBE header
    # activemq.prefetchSize overrides it); this bounds the bytes a slow consumer can have
    # in flight (and buffered in its gateway) whatever the message sizes.
    consumer_window_bytes: int = _setting(
        8 * MiB,
        "bytes of unacknowledged deliveries per subscription; a full window makes the "
        "consumer not ready (-1 = messages only)",
        min=-1,
        size=True,
    )
    # WebLogic's rate-based flow control (its defaults): instead of stopping producers at
    # a destination's high watermark, slow each one down, geometrically from
    # flow_maximum to flow_minimum over flow_interval_s in flow_steps steps, and let it
    # recover linearly once the destination is back under its low watermark.
    flow_control: bool = _setting(
        False, "slow producers of an armed destination down instead of stopping them"
    )
    flow_maximum: float = _setting(
        500.0, "messages/s a producer may send when it is first slowed down", min=0.001
    )
    flow_minimum: float = _setting(50.0, "messages/s the producer's rate decays to", min=0.001)
    flow_interval_s: float = _setting(60.0, "seconds the decay (and the recovery) takes", min=0.001)
    flow_steps: int = _setting(10, "steps of the decay and of the recovery", min=1)


@dataclass(frozen=True, slots=True)
class AdminSettings:
    """The admin API: HTTP JSON on a loopback port, served by the supervisor."""

    host: str = _setting("127.0.0.1", "address of the admin API (keep it on loopback)")
    # ActiveMQ's web console port.
    port: int = _setting(
        8161, "admin API port; 0 picks a free one, -1 switches it off", min=-1, max=65535
    )
    # A web page can make a browser ask http://evil.example:8161/ after pointing that name
    # at 127.0.0.1 (DNS rebinding); its Host header still says evil.example.
    host_names: str = _setting(
        "",
        "comma-separated names the admin API answers to in the Host header, besides "
        "localhost, 127.0.0.1, ::1 and admin.host (others get HTTP 403)",
    )
    stats_interval_ms: int = _setting(
        500, "how often every worker publishes its state for the admin API", min=10
    )
    # RabbitMQ's Prometheus plugin leaves per-queue series out by default for the same
    # reason: a scrape of tens of thousands of series is slow, and so is the TSDB.
    metrics_max_destinations: int = _setting(
        1000,
        "destinations (and durable subscriptions) with series of their own in GET /metrics; "
        'the rest are added up as destination="other"',
        min=0,
    )
    stats_bytes: int = _setting(
        256 * KiB,
        "room for one worker's published state in shared memory (a larger one goes to a "
        "spill file in /dev/shm)",
        min=4096,
    )


@dataclass(frozen=True, slots=True)
class SecuritySettings:
    """Who may connect (docs/security.md)."""

    users_file: str = _setting(
        "",
        "users and their password hashes (mpbroker user add); read at start and on SIGHUP; "
        '"" = none: any login is accepted',
    )
    # "auto": anonymous connections only where nothing else guards the broker's door
    # being open: no users file, and a loopback address (a non-loopback one without a
    # users file is refused at start unless this is "true").
    allow_anonymous: str = _setting(
        "auto",
        "a CONNECT without a login is let in: true, false, or auto (true only without a "
        "users file)",
        choices=("auto", "true", "false"),
    )

    def anonymous(self) -> bool:
        """Whether a CONNECT without a login is let in."""
        if self.allow_anonymous == "auto":
            return not self.users_file
        return self.allow_anonymous == "true"


@dataclass(frozen=True, slots=True)
class MemorySettings:
    """The broker's memory budget and MemWatch (iBus//MessageServer)."""

    max_memory: int = _setting(
        256 * MiB, "memory the whole broker may use (PSS of all its processes)", min=1, size=True
    )
    memwatch_interval_ms: int = _setting(
        1000, "how often MemWatch measures the broker's memory (0 = off)", min=0
    )
    memwatch_levels: str = _setting(
        "50,80", "percentages of max_memory where levels 1, 2, ... start (more may be added)"
    )
    memwatch_gc_intervals_ms: str = _setting(
        "2000,750", "how often workers collect garbage at each of those levels (0 = never)"
    )
    memwatch_warn_level: int = _setting(
        2, "entering this level (or a higher one) logs a warning (0 = never)", min=0
    )
    # The theoretical limit on message size; a frame also carries headers, so it may not
    # be above stomp.max_frame_bytes.
    max_message_bytes: int = _setting(
        -1,
        "largest message body a SEND may carry (-1 = only stomp.max_frame_bytes bounds it)",
        min=-1,
        size=True,
    )
    # The seed's socket reader message threshold.
    socket_reader_threshold_bytes: int = _setting(
        64 * KiB,
        "bytes a gateway reads from a socket at once; a message larger than this is taken "
        "only while MemWatch is below throttle_level (else it waits, as for flow control)",
        min=4096,
        size=True,
    )
    throttle_level: int = _setting(
        2,
        "from this MemWatch level on, producers are slowed down (rate-based flow) and "
        "non-persistent message bodies are paged to the temp store (0 = never)",
        min=0,
    )
    # MemWatch's backstop for broker.max_destinations, whose default is arithmetic on
    # measured costs: past this reading no destination is made, whatever their count.
    refuse_destinations_percent: float = _setting(
        95.0,
        "from this share of max_memory (MemWatch's reading) on, a SEND or SUBSCRIBE that "
        "would make a new destination is refused (0 = never)",
        min=0,
        max=100,
    )


@dataclass(frozen=True, slots=True)
class TempStoreSettings:
    """Flow-to-disk: bodies of non-persistent queue messages paged out of memory to a
    SQLite file per p2p worker (synchronous=OFF: it is emptied at every start)."""

    limit_bytes: int = _setting(
        1 * GiB,
        "disk the temp store of one p2p worker may use; when it is full, producers of "
        "non-persistent messages are stopped (-1 = no paging)",
        min=-1,
        size=True,
    )
    # An ActiveMQ temp store below its 32 MB journal file size blocked producers forever;
    # here a limit below one allocation unit is refused at start.
    segment_bytes: int = _setting(
        8 * MiB,
        "the temp store's allocation unit: it grows and shrinks by files of this size",
        min=64 * KiB,
        size=True,
    )
    page_step_bytes: int = _setting(
        1 * MiB,
        "most message bytes paged out between two batches, so paging never stalls delivery",
        min=4096,
        size=True,
    )


@dataclass(frozen=True, slots=True)
class CompressionSettings:
    """WebLogic's message compression: large bodies are stored and passed on compressed;
    consumers receive the original bytes."""

    threshold_bytes: int = _setting(
        -1,
        "bodies larger than this are compressed in the broker (-1 = never)",
        min=-1,
    )
    codec: str = _setting(
        "zstd",
        "zstd (Zstandard level 1: fast) or zlib (level 6: ~12 % smaller, 8x the CPU)",
        choices=("zstd", "zlib"),
    )


@dataclass(frozen=True, slots=True)
class StoreFlowSettings:
    """Watermarks of one kind of store: reaching a `high` stops the producers concerned,
    only falling to its `low` lets them go again. Per destination, and over all
    destinations of the store in one worker (`global_*`)."""

    msg_high: int = _watermark(-1, "messages in one destination that stop its producers")
    msg_low: int = _watermark(-1, "...and that let them go again")
    byte_high: int = _watermark(-1, "message bytes in one destination that stop its producers")
    byte_low: int = _watermark(-1, "...and that let them go again")
    global_msg_high: int = _watermark(-1, "messages in the whole store that stop every producer")
    global_msg_low: int = _watermark(-1, "...and that let them go again")
    global_byte_high: int = _watermark(
        -1, "message bytes in the whole store that stop every producer"
    )
    global_byte_low: int = _watermark(-1, "...and that let them go again")


@dataclass(frozen=True, slots=True)
class QuotaConfig:
    """A named quota (WebLogic): [quotas.NAME]. Destinations name theirs with
    `quota = "NAME"` in a [destinations] table; the others use the quota named "default"
    when there is one."""

    name: str
    max_messages: int = _setting(-1, "messages the quota holds at most (-1 = no limit)", min=-1)
    max_bytes: int = _setting(
        -1, "message bytes the quota holds at most (-1 = no limit)", min=-1, size=True
    )
    shared: bool = _setting(
        True, "destinations naming it compete for one quota (false: each gets its own)"
    )
    policy: str = _setting(
        "fifo",
        "fifo: waiting senders are served in arrival order; preemptive: a smaller message "
        "may pass a larger one that does not fit",
        choices=("fifo", "preemptive"),
    )


DEFAULT_QUOTA: Final = "default"

# What an [[security.acl]] entry grants: read (SUBSCRIBE), write (SEND), admin (durable
# subscriptions, and reading the dead-letter queue of a queue one administers).
ACL_PERMISSIONS: Final = ("read", "write", "admin")


@dataclass(frozen=True, slots=True)
class AclEntry:
    """One [[security.acl]] entry: who may read, write and administer the destinations
    `destination` matches (a [destinations] pattern). Each name is a user, `group:NAME`,
    or `*` (everyone who got in, anonymous connections included)."""

    destination: str
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    admin: tuple[str, ...] = ()

    def matches(self, destination: str) -> bool:
        return fnmatch.fnmatchcase(destination, self.destination)


# Settings a [destinations."<pattern>"] table may override, and the section whose setting
# it overrides (documentation, allowed range).
DESTINATION_KEYS: Final = {
    "msg_high": "vol_queue_store",
    "msg_low": "vol_queue_store",
    "byte_high": "vol_queue_store",
    "byte_low": "vol_queue_store",
    "live_msg_high": "topics",
    "live_msg_low": "topics",
    "send_timeout_ms": "flow",
    "consumer_window_bytes": "flow",
    "flow_control": "flow",
    "flow_maximum": "flow",
    "flow_minimum": "flow",
    "flow_interval_s": "flow",
    "flow_steps": "flow",
    "expiry_policy": "queues",
    "expiry_log_fields": "queues",
    "expiry_destination": "queues",
    "quota": "quotas",
}


@dataclass(frozen=True, slots=True)
class DestinationSettings:
    """Settings for the destinations whose name matches `pattern`, over the store and
    broker defaults. None = not set here (the default applies)."""

    pattern: str  # fnmatch: * any run of characters, ? one, [abc] one of
    msg_high: int | None = None  # per destination, in whichever store holds its messages
    msg_low: int | None = None
    byte_high: int | None = None
    byte_low: int | None = None
    live_msg_high: int | None = None  # topics: the slowest subscriber's backlog
    live_msg_low: int | None = None
    send_timeout_ms: int | None = None
    consumer_window_bytes: int | None = None
    flow_control: bool | None = None  # rate-based flow
    flow_maximum: float | None = None
    flow_minimum: float | None = None
    flow_interval_s: float | None = None
    flow_steps: int | None = None
    expiry_policy: str | None = None  # queues
    expiry_log_fields: str | None = None
    expiry_destination: str | None = None
    quota: str | None = None  # the name of a [quotas.NAME] table

    def matches(self, destination: str) -> bool:
        return fnmatch.fnmatchcase(destination, self.pattern)

    def items(self) -> list[tuple[str, int | float | str | bool]]:
        """The settings this table sets, in declaration order."""
        return [(k, v) for k in DESTINATION_KEYS if (v := getattr(self, k)) is not None]


@dataclass(frozen=True, slots=True)
class Config:
    broker: BrokerSettings = field(default_factory=BrokerSettings)
    stomp: StompSettings = field(default_factory=StompSettings)
    rings: RingSettings = field(default_factory=RingSettings)
    queues: QueueSettings = field(default_factory=QueueSettings)
    topics: TopicSettings = field(default_factory=TopicSettings)
    transactions: TransactionSettings = field(default_factory=TransactionSettings)
    selectors: SelectorSettings = field(default_factory=SelectorSettings)
    store: StoreSettings = field(default_factory=StoreSettings)
    replay: ReplaySettings = field(default_factory=ReplaySettings)
    flow: FlowSettings = field(default_factory=FlowSettings)
    admin: AdminSettings = field(default_factory=AdminSettings)
    security: SecuritySettings = field(default_factory=SecuritySettings)
    memory: MemorySettings = field(default_factory=MemorySettings)
    compression: CompressionSettings = field(default_factory=CompressionSettings)
    temp_store: TempStoreSettings = field(default_factory=TempStoreSettings)
    # The seed's VolQueueStore: 16 MB high, 15 MB low (with a temp store: where paging
    # starts). Every waiting message keeps an entry in memory, paged or not, so the counts
    # are bounded too (they are most of the memory budget: mpbroker/memory/_budget.py); per queue,
    # stop before the hard queues.max_messages refusal.
    vol_queue_store: StoreFlowSettings = field(
        default_factory=functools.partial(
            StoreFlowSettings,
            msg_high=50000,
            msg_low=40000,
            global_msg_high=60000,
            global_msg_low=50000,
            global_byte_high=16 * MiB,
            global_byte_low=15 * MiB,
        )
    )
    # Persistent backlogs live on disk, but each waiting message keeps an index entry.
    pers_queue_store: StoreFlowSettings = field(
        default_factory=functools.partial(
            StoreFlowSettings,
            msg_high=40000,
            msg_low=30000,
            global_msg_high=40000,
            global_msg_low=30000,
        )
    )
    topic_store: StoreFlowSettings = field(default_factory=StoreFlowSettings)
    # [destinations."<pattern>"] tables, in file order: the first that matches wins.
    destinations: tuple[DestinationSettings, ...] = field(default=(), metadata={"tables": True})
    # [quotas.NAME] tables.
    quotas: tuple[QuotaConfig, ...] = field(default=(), metadata={"tables": True})
    # [[security.acl]] entries, in file order (all that match count: see mpbroker.security).
    acl: tuple[AclEntry, ...] = field(default=(), metadata={"tables": True})

    def setting_for(self, destination: str, key: str) -> Any:
        """A setting as it applies to `destination`: its [destinations] table's value, or
        the default of the section DESTINATION_KEYS names. (The store watermarks, whose
        section depends on the store, are read with `flow.destination_limits`.)"""
        table = self.destination(destination)
        value = getattr(table, key) if table is not None else None
        return getattr(getattr(self, DESTINATION_KEYS[key]), key) if value is None else value

    def send_timeout_ms(self, destination: str) -> int:
        """How long a stopped SEND to `destination` waits before it is refused."""
        timeout: int = self.setting_for(destination, "send_timeout_ms")
        return timeout

    def consumer_window_bytes(self, destination: str) -> int:
        """The byte window of a subscription to `destination` (-1: none)."""
        window: int = self.setting_for(destination, "consumer_window_bytes")
        return window

    def destination(self, name: str) -> DestinationSettings | None:
        """The settings table for a destination, or None when only defaults apply."""
        for table in self.destinations:
            if table.matches(name):
                return table
        return None


def sections() -> list[dataclasses.Field[Any]]:
    """Config's sections of scalar settings (not the [destinations] tables)."""
    return [f for f in dataclasses.fields(Config) if not f.metadata.get("tables")]


def section_defaults() -> dict[str, Any]:
    """Each section's default settings (sections of one type may differ in defaults)."""
    return {
        f.name: f.default_factory()  # type: ignore[operator]
        for f in sections()
    }
