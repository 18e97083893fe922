"""Limits that contradict each other are refused, naming both numbers. Pure."""

from __future__ import annotations

from mpbroker.stomp import BadOrigin, parse_allowed_origins

from ._errors import ConfigError
from ._schema import Config, StoreFlowSettings
from ._units import GiB
from ._values import parse_disk_free_limit, parse_levels, parse_log_fields

__all__ = ["check_consistency", "check_security", "check_watermark"]


def _check_memory(config: Config) -> None:
    memory = config.memory
    if memory.max_message_bytes == 0:
        raise ConfigError("memory.max_message_bytes", 0, "no message could be sent (-1 = no limit)")
    if memory.max_message_bytes > config.stomp.max_frame_bytes:
        raise ConfigError(
            "memory.max_message_bytes",
            memory.max_message_bytes,
            f"must not exceed stomp.max_frame_bytes = {config.stomp.max_frame_bytes} "
            "(a message travels in one frame)",
        )
    try:
        levels = parse_levels(memory.memwatch_levels, memory.memwatch_gc_intervals_ms)
    except ValueError as exc:
        raise ConfigError("memory.memwatch_levels", memory.memwatch_levels, str(exc)) from None
    if memory.memwatch_warn_level > len(levels):
        raise ConfigError(
            "memory.memwatch_warn_level",
            memory.memwatch_warn_level,
            f"there are only {len(levels)} levels in memory.memwatch_levels",
        )
    if memory.throttle_level > len(levels):
        raise ConfigError(
            "memory.throttle_level",
            memory.throttle_level,
            f"there are only {len(levels)} levels in memory.memwatch_levels",
        )
    temp = config.temp_store
    if temp.limit_bytes != -1 and temp.limit_bytes < temp.segment_bytes:
        raise ConfigError(
            "temp_store.limit_bytes",
            temp.limit_bytes,
            f"below temp_store.segment_bytes = {temp.segment_bytes}, the temp store's "
            "allocation unit: nothing could ever be paged and producers would wait forever",
        )


def _check_quotas(config: Config) -> None:
    names = {q.name for q in config.quotas}
    for table in config.destinations:
        if table.quota is not None and table.quota not in names:
            raise ConfigError(
                f'destinations."{table.pattern}".quota',
                table.quota,
                f"no [quotas.{table.quota}] table (known: {', '.join(sorted(names)) or 'none'})",
            )
        # Quotas bound queues (the p2p workers keep them). A table that can only match
        # topics would be accepted and do nothing: refused instead.
        if table.quota is not None and table.pattern.startswith("/topic/"):
            raise ConfigError(
                f'destinations."{table.pattern}".quota',
                table.quota,
                "quotas apply to queues only; a topic's messages are bounded by the live "
                "buffer (topics.live_msg_high) and the topic_store watermarks",
            )
    largest = config.stomp.max_frame_bytes
    for quota in config.quotas:
        if 0 <= quota.max_bytes < largest:
            raise ConfigError(
                f"quotas.{quota.name}.max_bytes",
                quota.max_bytes,
                f"below stomp.max_frame_bytes = {largest}: the largest message could never fit",
            )
        if quota.max_messages == 0:
            raise ConfigError(
                f"quotas.{quota.name}.max_messages", 0, "no message could ever fit (-1 = no limit)"
            )


def _check_transactions(config: Config) -> None:
    transactions = config.transactions
    per_connection = transactions.max_uncommitted_bytes_per_connection
    if per_connection == 0:
        raise ConfigError(
            "transactions.max_uncommitted_bytes_per_connection",
            0,
            "no transaction could hold a message (-1 = up to max_uncommitted_bytes)",
        )
    # Refused rather than clamped: the operator meant a number the broker would not keep.
    if per_connection > transactions.max_uncommitted_bytes:
        raise ConfigError(
            "transactions.max_uncommitted_bytes_per_connection",
            per_connection,
            "must not exceed transactions.max_uncommitted_bytes = "
            f"{transactions.max_uncommitted_bytes} (-1 = up to it)",
        )


def check_consistency(config: Config) -> None:
    """Limits that contradict each other are refused, naming both numbers."""
    _check_transactions(config)
    _check_disk_free_limit(config)
    prefix = config.queues.dead_letter_prefix
    if not prefix or any(c in prefix for c in "/\r\n:") or prefix != prefix.strip():
        raise ConfigError(
            "queues.dead_letter_prefix",
            prefix,
            "must be a non-empty name part without '/', ':', spaces at its ends or line breaks",
        )
    cap = config.rings.capacity_bytes
    if cap & (cap - 1):
        raise ConfigError("rings.capacity_bytes", cap, "must be a power of two")
    # mpbroker.shm.MAX_CAPACITY: a record's length and fragment flag share 32 bits.
    if cap > GiB:
        raise ConfigError("rings.capacity_bytes", cap, f"must be at most {GiB} (1 GiB)")
    # No rule ties the rings to stomp.max_frame_bytes or replay.replay_bytes: a record larger
    # than a quarter of its ring goes through it in fragments.
    replay = config.replay
    if replay.replay_bytes > replay.global_bytes:
        raise ConfigError(
            "replay.replay_bytes",
            replay.replay_bytes,
            f"must not exceed replay.global_bytes = {replay.global_bytes}",
        )
    _check_flow(config)
    _check_expiry(config)
    _check_rate_flow(config)
    _check_quotas(config)
    _check_memory(config)
    if config.stomp.max_header_bytes > config.stomp.max_frame_bytes:
        raise ConfigError(
            "stomp.max_header_bytes",
            config.stomp.max_header_bytes,
            f"must not exceed stomp.max_frame_bytes = {config.stomp.max_frame_bytes}",
        )
    _check_tls(config)
    _check_listeners(config)


def _check_tls(config: Config) -> None:
    """The TLS listeners' settings fit together (whether their files load is for the
    start: `mpbroker.security.server_context`). Both stomp.tls_port and stomp.wss_port use
    the stomp.tls_* files."""
    stomp = config.stomp
    using = [
        f"stomp.{key} = {getattr(stomp, key)}" for key in _TLS_PORTS if getattr(stomp, key) >= 0
    ]
    if not using:
        # Set without a TLS listener they would do nothing: say so rather than ignore them.
        for key in ("tls_cert_file", "tls_key_file", "tls_ca_file", "tls_require_client_cert"):
            value = getattr(stomp, key)
            if value:
                raise ConfigError(
                    f"stomp.{key}",
                    value,
                    "has no effect without stomp.tls_port or stomp.wss_port (-1: no TLS)",
                )
        return
    for key in ("tls_cert_file", "tls_key_file"):
        if not getattr(stomp, key):
            raise ConfigError(
                f"stomp.{key}",
                "",
                f"required by {using[0]} (a PEM file; -1 = no TLS listener)",
            )
    if stomp.tls_require_client_cert and not stomp.tls_ca_file:
        raise ConfigError(
            "stomp.tls_ca_file",
            "",
            "required by stomp.tls_require_client_cert = true (the CA certificates that "
            "must have signed a client's certificate, PEM)",
        )


# The listeners of every gateway besides broker.port, each on a port of its own.
_TLS_PORTS = ("tls_port", "wss_port")
_EXTRA_PORTS = ("tls_port", "ws_port", "wss_port")


def _check_listeners(config: Config) -> None:
    """No two listeners on one port (0 picks a free one for each), and origins that are
    origins."""
    stomp = config.stomp
    taken = {config.broker.port: "broker.port"} if config.broker.port else {}
    for key in _EXTRA_PORTS:
        port = getattr(stomp, key)
        if port > 0:
            if port in taken:
                raise ConfigError(f"stomp.{key}", port, f"must differ from {taken[port]} = {port}")
            taken[port] = f"stomp.{key}"
    try:
        parse_allowed_origins(stomp.ws_allowed_origins)
    except BadOrigin as exc:
        raise ConfigError("stomp.ws_allowed_origins", stomp.ws_allowed_origins, str(exc)) from None
    if stomp.ws_allowed_origins and stomp.ws_port < 0 and stomp.wss_port < 0:
        raise ConfigError(
            "stomp.ws_allowed_origins",
            stomp.ws_allowed_origins,
            "has no effect without stomp.ws_port or stomp.wss_port (-1: no WebSocket)",
        )


def _check_rate_flow(config: Config) -> None:
    flow = config.flow
    pairs = [("flow", flow.flow_minimum, flow.flow_maximum)]
    for table in config.destinations:
        low = table.flow_minimum if table.flow_minimum is not None else flow.flow_minimum
        high = table.flow_maximum if table.flow_maximum is not None else flow.flow_maximum
        pairs.append((f'destinations."{table.pattern}"', low, high))
    for where, low, high in pairs:
        if low > high:
            raise ConfigError(
                f"{where}.flow_minimum", low, f"must not exceed flow_maximum = {high}"
            )


def _check_disk_free_limit(config: Config) -> None:
    text = config.store.disk_free_limit_bytes
    try:
        parse_disk_free_limit(text)
    except ValueError as exc:
        raise ConfigError("store.disk_free_limit_bytes", text, str(exc)) from None


def _check_expiry(config: Config) -> None:
    tables: list[tuple[str, str | None, str | None]] = [
        ("queues", config.queues.expiry_log_fields, config.queues.expiry_destination)
    ]
    tables += [
        (f'destinations."{t.pattern}"', t.expiry_log_fields, t.expiry_destination)
        for t in config.destinations
    ]
    for where, fields, target in tables:
        if fields is not None:
            try:
                parse_log_fields(fields)
            except ValueError as exc:
                raise ConfigError(f"{where}.expiry_log_fields", fields, str(exc)) from None
        if target and not target.startswith("/queue/"):
            raise ConfigError(
                f"{where}.expiry_destination", target, "must be a queue: /queue/NAME (or '')"
            )


def check_watermark(high_key: str, high: int, low_key: str, low: int) -> None:
    if high == -1 and low != -1:
        raise ConfigError(low_key, low, f"must be -1 while {high_key} is -1")
    if high != -1 and not 0 <= low < high:
        raise ConfigError(low_key, low, f"must be from 0 to below {high_key} = {high}")


def _check_flow(config: Config) -> None:
    """Watermarks: low below high, a destination's limit within the global one, and
    below the hard limits that refuse."""
    for section in ("vol_queue_store", "pers_queue_store", "topic_store"):
        flow: StoreFlowSettings = getattr(config, section)
        pairs = {
            "msg": (flow.msg_high, flow.msg_low),
            "byte": (flow.byte_high, flow.byte_low),
            "global_msg": (flow.global_msg_high, flow.global_msg_low),
            "global_byte": (flow.global_byte_high, flow.global_byte_low),
        }
        for what, (high, low) in pairs.items():
            check_watermark(f"{section}.{what}_high", high, f"{section}.{what}_low", low)
        for what in ("msg", "byte"):
            high, global_high = pairs[what][0], pairs["global_" + what][0]
            if high != -1 and global_high != -1 and high > global_high:
                raise ConfigError(
                    f"{section}.{what}_high",
                    high,
                    f"must not exceed {section}.global_{what}_high = {global_high}",
                )
        if section != "topic_store" and flow.msg_high > config.queues.max_messages:
            raise ConfigError(
                f"{section}.msg_high",
                flow.msg_high,
                f"must not exceed queues.max_messages = {config.queues.max_messages} "
                "(producers must stop before messages are refused)",
            )
    topics = config.topics
    check_watermark(
        "topics.live_msg_high", topics.live_msg_high, "topics.live_msg_low", topics.live_msg_low
    )
    check_watermark(
        "topics.global_live_msg_high",
        topics.global_live_msg_high,
        "topics.global_live_msg_low",
        topics.global_live_msg_low,
    )
    check_watermark(
        "topics.global_live_byte_high",
        topics.global_live_byte_high,
        "topics.global_live_byte_low",
        topics.global_live_byte_low,
    )
    if -1 < topics.global_live_msg_high < topics.live_msg_high:
        raise ConfigError(
            "topics.live_msg_high",
            topics.live_msg_high,
            f"must not exceed topics.global_live_msg_high = {topics.global_live_msg_high}",
        )
    if topics.live_msg_high != -1 and topics.live_msg_high > topics.max_pending_messages:
        raise ConfigError(
            "topics.live_msg_high",
            topics.live_msg_high,
            f"must not exceed topics.max_pending_messages = {topics.max_pending_messages}",
        )
    for table in config.destinations:
        where = f'destinations."{table.pattern}"'
        hard = (
            ("msg_high", table.msg_high, "queues.max_messages", config.queues.max_messages),
            (
                "live_msg_high",
                table.live_msg_high,
                "topics.max_pending_messages",
                topics.max_pending_messages,
            ),
        )
        for key, limit, hard_key, hard_value in hard:
            if limit is not None and limit > hard_value:
                raise ConfigError(
                    f"{where}.{key}", limit, f"must not exceed {hard_key} = {hard_value}"
                )
        # A destination's limit above the global one of its store could never stop it.
        stores: tuple[str, ...] = ("vol_queue_store", "pers_queue_store")
        if table.pattern.startswith("/topic/"):
            stores = ("topic_store",)
        for what, limit in (("msg", table.msg_high), ("byte", table.byte_high)):
            for store in stores:
                global_high = getattr(getattr(config, store), f"global_{what}_high")
                if limit is not None and limit != -1 and global_high != -1 and limit > global_high:
                    raise ConfigError(
                        f"{where}.{what}_high",
                        limit,
                        f"must not exceed {store}.global_{what}_high = {global_high}",
                    )
    vol = config.vol_queue_store
    for key, high in (("byte_high", vol.byte_high), ("global_byte_high", vol.global_byte_high)):
        if high > config.queues.max_bytes:
            raise ConfigError(
                f"vol_queue_store.{key}",
                high,
                f"must not exceed queues.max_bytes = {config.queues.max_bytes} "
                "(producers must stop before messages are refused)",
            )


def check_security(config: Config) -> None:
    """Security settings that would protect nothing without a users file are refused."""
    security = config.security
    if security.allow_anonymous == "false" and not security.users_file:
        raise ConfigError(
            "security.allow_anonymous",
            "false",
            "needs security.users_file: without one any login is let in, so refusing only "
            "CONNECTs without a login would protect nothing",
        )
    if config.acl and not security.users_file:
        # Without a users file a login is whatever the client says: anyone could be anyone.
        raise ConfigError(
            "security.acl",
            f"{len(config.acl)} {'entry' if len(config.acl) == 1 else 'entries'}",
            "needs security.users_file (logins are "
            "not checked without one, so an entry would protect nothing)",
        )
