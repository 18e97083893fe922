"""Configuration: defaults, sizes, validation messages, consistency checks, TOML loading."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest

from mpbroker.config import (
    BrokerSettings,
    Config,
    ConfigError,
    GiB,
    KiB,
    MiB,
    QueueSettings,
    StompSettings,
    config_from_mapping,
    iter_settings,
    load_config,
    parse_size,
    replace_settings,
)


def refused(data: dict[str, Any]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        config_from_mapping(data)
    return info.value


# -- defaults --------------------------------------------------------------------------------


def test_no_file_means_the_documented_defaults() -> None:
    config = load_config(None)
    assert config == Config() == config_from_mapping({})
    assert config.broker.port == 61613
    assert config.broker.host == "127.0.0.1"
    assert config.stomp.max_frame_bytes == 1 * MiB
    assert config.rings.capacity_bytes == 1 * MiB
    assert config.queues.max_bytes == 24 * MiB
    assert config.vol_queue_store.global_byte_high == 16 * MiB
    assert config.flow.send_timeout_ms == 10000
    assert config.queues.prefetch == 1000
    assert config.topics.max_pending_messages == 10000
    assert config.transactions.max_uncommitted_bytes == 2 * MiB
    assert config.stomp.heartbeat_grace == 2.0


def test_every_setting_is_documented_and_listed_in_declaration_order() -> None:
    rows = iter_settings(Config())
    keys = [key for key, _, _ in rows]
    assert keys[0] == "broker.host"
    assert len(keys) == len(set(keys))
    assert {key.split(".")[0] for key in keys} == {
        "broker",
        "stomp",
        "rings",
        "queues",
        "topics",
        "transactions",
        "selectors",
        "store",
        "replay",
        "flow",
        "admin",
        "security",
        "memory",
        "compression",
        "temp_store",
        "vol_queue_store",
        "pers_queue_store",
        "topic_store",
    }
    assert all(doc for _, _, doc in rows)
    assert (
        "queues.max_messages",
        100000,
        "most messages one queue holds (waiting, or delivered and not yet acknowledged)",
    ) in rows


def test_settings_are_immutable() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Config().broker.port = 1  # type: ignore[misc]


def test_gateway_count_zero_means_one_per_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 6)
    assert BrokerSettings(gateways=0).gateway_count() == 6
    assert BrokerSettings(gateways=3).gateway_count() == 3
    monkeypatch.setattr("os.cpu_count", lambda: None)
    assert BrokerSettings().gateway_count() == 1


# -- sizes -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("16MiB", 16 * MiB),
        ("64 KiB", 64 * KiB),
        ("1.5MB", 1_500_000),
        ("2GiB", 2 * GiB),
        ("3gb", 3_000_000_000),
        ("10kb", 10_000),
        ("512", 512),
        ("512B", 512),
        (" 7 mib ", 7 * MiB),
        ("0.5KiB", 512),
    ],
)
def test_parse_size_understands_binary_and_decimal_units(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "MiB", "-1MiB", "1TiB", "1 M", "one", "1e6", "1,000"])
def test_parse_size_refuses_what_is_not_a_size(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def test_byte_settings_accept_size_strings() -> None:
    config = config_from_mapping(
        {"queues": {"max_bytes": "32MiB"}, "rings": {"capacity_bytes": "4 MiB"}}
    )
    assert config.queues.max_bytes == 32 * MiB
    assert config.rings.capacity_bytes == 4 * MiB


def test_a_bad_size_names_the_key_and_says_sizes_are_allowed() -> None:
    error = refused({"queues": {"max_bytes": "lots"}})
    assert error.key == "queues.max_bytes"
    assert error.value == "lots"
    assert "'16MiB'" in error.allowed
    assert str(error).startswith("config: queues.max_bytes = 'lots': ")


def test_size_strings_are_only_for_byte_settings() -> None:
    error = refused({"queues": {"max_messages": "10KiB"}})
    assert error.key == "queues.max_messages"
    assert "integer" in error.allowed


# -- value validation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "key", "value", "allowed"),
    [
        ("broker", "port", 70000, "must be an integer from 0 to 65535"),
        ("broker", "port", -1, "must be an integer from 0 to 65535"),
        ("broker", "gateways", 257, "must be an integer from 0 to 256"),
        ("broker", "p2p_workers", -1, "must be an integer from 0 to 64"),
        ("broker", "pubsub_workers", 65, "must be an integer from 0 to 64"),
        ("broker", "max_connections", 0, "must be an integer >= 1"),
        ("broker", "log_level", "verbose", "allowed: 'debug', 'info', 'warning', 'error'"),
        ("broker", "host", 127, "must be a string"),
        ("broker", "port", "61613", "must be an integer from 0 to 65535"),
        ("broker", "port", 1.0, "must be an integer from 0 to 65535"),
        ("stomp", "heartbeat_grace", 0.5, "must be a number >= 1"),
        ("stomp", "heartbeat_grace", "2", "must be a number >= 1"),
        ("stomp", "max_frame_bytes", 255, "must be an integer >= 256"),
        ("rings", "park_timeout_ms", 10001, "must be an integer from 1 to 10000"),
        ("queues", "prefetch", 0, "must be an integer >= 1"),
        ("topics", "max_pending_messages", 0, "must be an integer >= 1"),
        ("transactions", "max_open_per_connection", 0, "must be an integer >= 1"),
        ("transactions", "max_uncommitted_bytes_per_connection", -2, "must be an integer >= -1"),
        ("transactions", "timeout_ms", -1, "must be an integer >= 0"),
        (
            "transactions",
            "reduce_strategy",
            "MAXBYTES",
            "allowed: 'max_bytes', 'max_messages', 'oldest_tx', 'youngest_tx', 'all', 'none'",
        ),
    ],
)
def test_a_bad_value_names_the_key_the_value_and_what_is_allowed(
    section: str, key: str, value: object, allowed: str
) -> None:
    error = refused({section: {key: value}})
    assert error.key == f"{section}.{key}"
    assert error.value == value
    assert error.allowed == allowed
    assert str(error) == f"config: {section}.{key} = {value!r}: {allowed}"


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ("broker", "gateways"),
        ("broker", "port"),
        ("queues", "max_bytes"),
        ("stomp", "heartbeat_grace"),
    ],
)
def test_a_bool_is_not_a_number(section: str, key: str) -> None:
    error = refused({section: {key: True}})
    assert error.key == f"{section}.{key}"
    assert error.value is True


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_non_finite_numbers_are_refused(value: float) -> None:
    error = refused({"stomp": {"heartbeat_grace": value}})
    assert error.key == "stomp.heartbeat_grace"


def test_an_integer_is_accepted_where_a_number_is_expected() -> None:
    config = config_from_mapping({"stomp": {"heartbeat_grace": 3}})
    assert config.stomp.heartbeat_grace == 3.0
    assert isinstance(config.stomp.heartbeat_grace, float)


def test_limits_at_the_edges_of_their_range_are_accepted() -> None:
    config = config_from_mapping(
        {"broker": {"port": 0, "gateways": 256, "p2p_workers": 64}, "stomp": {"heartbeat_grace": 1}}
    )
    assert (config.broker.port, config.broker.gateways, config.broker.p2p_workers) == (0, 256, 64)


def test_an_unknown_section_is_refused_listing_the_known_ones() -> None:
    error = refused({"queue": {"prefetch": 5}})
    assert error.key == "queue"
    assert "unknown section" in error.allowed
    assert "queues" in error.allowed and "transactions" in error.allowed


def test_an_unknown_key_is_refused_listing_the_known_ones() -> None:
    error = refused({"broker": {"prot": 1}})
    assert error.key == "broker.prot"
    assert error.value == 1
    assert "unknown setting" in error.allowed
    assert "port" in error.allowed


def test_a_section_must_be_a_table() -> None:
    error = refused({"broker": 5})
    assert error.key == "broker"
    assert error.allowed == "must be a table of settings"


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


# -- consistency -----------------------------------------------------------------------------


def test_ring_capacity_must_be_a_power_of_two() -> None:
    error = refused({"rings": {"capacity_bytes": 3 * MiB}})
    assert error.key == "rings.capacity_bytes"
    assert error.value == 3 * MiB
    assert error.allowed == "must be a power of two"


def test_rings_need_not_hold_the_largest_frame_or_a_replay_batch() -> None:
    # Records larger than a quarter of a ring go through it in fragments (issue 5).
    config = config_from_mapping(
        {
            "rings": {"capacity_bytes": "64KiB"},
            "stomp": {"max_frame_bytes": "20MiB"},
            "replay": {"replay_bytes": "1MiB"},
        }
    )
    assert config.rings.capacity_bytes == 64 * KiB
    assert config.stomp.max_frame_bytes == 20 * MiB
    error = refused({"rings": {"capacity_bytes": "2GiB"}})
    assert error.key == "rings.capacity_bytes"


def test_a_header_line_cannot_be_longer_than_a_frame() -> None:
    error = refused({"stomp": {"max_frame_bytes": 1000, "max_header_bytes": 1001}})
    assert error.key == "stomp.max_header_bytes"
    assert error.value == 1001
    assert "stomp.max_frame_bytes = 1000" in error.allowed


def test_transaction_memory_defaults_keep_one_connection_free_to_use_the_whole_total() -> None:
    transactions = Config().transactions
    assert transactions.max_uncommitted_bytes_per_connection == -1  # up to the total
    assert transactions.reduce_strategy == "max_bytes"
    assert transactions.timeout_ms == 0
    config = config_from_mapping(
        {"transactions": {"max_uncommitted_bytes_per_connection": "512KiB", "timeout_ms": 30000}}
    )
    assert config.transactions.max_uncommitted_bytes_per_connection == 512 * KiB


def test_a_per_connection_transaction_limit_above_the_total_is_refused_naming_both() -> None:
    error = refused(
        {
            "transactions": {
                "max_uncommitted_bytes": "1MiB",
                "max_uncommitted_bytes_per_connection": "2MiB",
            }
        }
    )
    assert error.key == "transactions.max_uncommitted_bytes_per_connection"
    assert error.value == 2 * MiB
    assert error.allowed == (
        f"must not exceed transactions.max_uncommitted_bytes = {MiB} (-1 = up to it)"
    )
    equal = {"max_uncommitted_bytes": 1000, "max_uncommitted_bytes_per_connection": 1000}
    assert (
        config_from_mapping({"transactions": equal}).transactions
        == replace_settings(Config(), "transactions", **equal).transactions
    )


def test_a_per_connection_transaction_limit_of_zero_is_refused() -> None:
    error = refused({"transactions": {"max_uncommitted_bytes_per_connection": 0}})
    assert error.key == "transactions.max_uncommitted_bytes_per_connection"
    assert "no transaction could hold a message" in error.allowed


# -- Config.replace --------------------------------------------------------------------------


def test_replace_changes_one_section_and_keeps_the_rest() -> None:
    base = config_from_mapping({"queues": {"prefetch": 7}})
    changed = replace_settings(base, "broker", port=1234, host="0.0.0.0")
    assert changed.broker.port == 1234
    assert changed.broker.host == "0.0.0.0"
    assert changed.queues.prefetch == 7
    assert base.broker.port == 61613  # the original is untouched


def test_replace_validates_the_new_values() -> None:
    with pytest.raises(ConfigError) as info:
        replace_settings(Config(), "broker", port=99999)
    assert info.value.key == "broker.port"
    with pytest.raises(ConfigError) as info:
        replace_settings(Config(), "stomp", max_header_bytes=2 * MiB)
    assert info.value.key == "stomp.max_header_bytes"
    with pytest.raises(ConfigError) as info:
        replace_settings(Config(), "queues", nonsense=1)
    assert info.value.key == "queues.nonsense"


def test_replace_accepts_sizes_like_the_file_does() -> None:
    assert replace_settings(Config(), "queues", max_bytes="32MiB").queues == QueueSettings(
        max_bytes=32 * MiB
    )
    flow = replace_settings(
        Config(), "topic_store", byte_high="1MiB", byte_low="512KiB"
    ).topic_store
    assert (flow.byte_high, flow.byte_low) == (MiB, 512 * KiB)


def test_watermarks_that_contradict_each_other_are_refused_naming_both() -> None:
    cases = [
        (
            {"vol_queue_store": {"msg_low": 90000}},
            "vol_queue_store.msg_low",
            "must be from 0 to below vol_queue_store.msg_high = 50000",
        ),
        (
            {"topic_store": {"msg_low": 5}},
            "topic_store.msg_low",
            "must be -1 while topic_store.msg_high is -1",
        ),
        (
            {"pers_queue_store": {"global_msg_high": 50, "global_msg_low": 10}},
            "pers_queue_store.msg_high",
            "must not exceed pers_queue_store.global_msg_high = 50",
        ),
        (
            {"queues": {"max_messages": 5}},
            "vol_queue_store.msg_high",
            "must not exceed queues.max_messages = 5",
        ),
        (
            {"queues": {"max_bytes": "1MiB"}},
            "vol_queue_store.global_byte_high",
            "must not exceed queues.max_bytes = 1048576",
        ),
        (
            {"topics": {"max_pending_messages": 100}},
            "topics.live_msg_high",
            "must not exceed topics.max_pending_messages = 100",
        ),
    ]
    for data, key, why in cases:
        with pytest.raises(ConfigError) as info:
            config_from_mapping(data)
        assert info.value.key == key
        assert why in str(info.value)


# -- load_config -----------------------------------------------------------------------------


def test_load_config_overlays_a_toml_file_on_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text(
        '[broker]\nport = 7000\nlog_level = "debug"\n\n[stomp]\nmax_frame_bytes = "256KiB"\n'
    )
    config = load_config(path)
    assert config.broker.port == 7000
    assert config.broker.log_level == "debug"
    assert config.stomp == StompSettings(max_frame_bytes=256 * KiB)
    assert config.queues == Config().queues
    assert load_config(str(path)) == config


def test_an_empty_file_gives_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "empty.toml"
    path.write_text("")
    assert load_config(path) == Config()


def test_a_missing_file_is_a_config_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.key == "--config"
    assert info.value.value == str(path)
    assert info.value.allowed == "file not found"


def test_invalid_toml_is_a_config_error_saying_where(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[broker\nport = 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.key == "--config"
    assert info.value.allowed.startswith("not valid TOML: ")
    assert "line 1" in info.value.allowed


def test_a_bad_value_in_a_file_names_the_key(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text("[broker]\ngateways = true\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.key == "broker.gateways"


def test_a_top_level_key_in_a_file_is_an_unknown_section(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text("port = 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.key == "port"
    assert "unknown section" in info.value.allowed


def test_a_config_path_that_is_a_directory_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be read"):
        load_config(tmp_path)


def test_a_config_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "x.toml").write_bytes(b'[broker]\nhost = "caf\xe9"\n')
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(tmp_path / "x.toml")


def test_destination_tables_override_defaults_for_matching_names_first_match_wins() -> None:
    config = load_config_text(
        '[destinations."/queue/orders.*"]\nmsg_high = 100\nmsg_low = 50\n'
        "send_timeout_ms = 0\n"
        '[destinations."/queue/*"]\nbyte_high = "1MiB"\nbyte_low = "512KiB"\n'
        '[destinations."/topic/news"]\nlive_msg_high = 10\nlive_msg_low = 2\n'
    )
    orders = config.destination("/queue/orders.eu")
    assert orders is not None
    assert orders.items() == [("msg_high", 100), ("msg_low", 50), ("send_timeout_ms", 0)]
    other = config.destination("/queue/other")
    assert other is not None and other.items() == [("byte_high", MiB), ("byte_low", 512 * KiB)]
    assert config.destination("/topic/sport") is None
    # What config show prints reads back as the same config.
    assert replace_settings(config, "flow", send_timeout_ms=5).destinations == config.destinations


def test_bad_destination_tables_are_refused_naming_the_table_and_setting() -> None:
    cases = [
        ({"/queue/x": {"msg_high": 10}}, 'destinations."/queue/x".msg_low', "set together"),
        ({"orders": {}}, 'destinations."orders"', "starts with /queue/ or /topic/"),
        ({"/queue/x": {"prefetch": 1}}, 'destinations."/queue/x".prefetch', "unknown setting"),
        (
            {"/queue/x": {"msg_high": 10, "msg_low": 20}},
            'destinations."/queue/x".msg_low',
            'below destinations."/queue/x".msg_high = 10',
        ),
        (
            {"/queue/x": {"msg_high": 200000, "msg_low": 1}},
            'destinations."/queue/x".msg_high',
            "must not exceed queues.max_messages = 100000",
        ),
        ({"/queue/x": {"send_timeout_ms": -1}}, 'destinations."/queue/x".send_timeout_ms', ">= 0"),
    ]
    for tables, key, why in cases:
        with pytest.raises(ConfigError) as info:
            config_from_mapping({"destinations": tables})
        assert info.value.key == key
        assert why in str(info.value)


def load_config_text(text: str) -> Config:
    import tomllib

    return config_from_mapping(tomllib.loads(text))


def test_rate_flow_minimum_above_maximum_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        config_from_mapping({"destinations": {"/queue/x": {"flow_minimum": 1000.0}}})
    assert info.value.key == 'destinations."/queue/x".flow_minimum'
    assert "must not exceed flow_maximum = 500.0" in str(info.value)


def test_a_reload_takes_the_flow_settings_and_names_what_needs_a_restart() -> None:
    from mpbroker.config import reload_flow_settings

    old = config_from_mapping({"vol_queue_store": {"msg_high": 3, "msg_low": 1}})
    new = config_from_mapping(
        {
            "vol_queue_store": {"msg_high": 10, "msg_low": 5},
            "topics": {"live_msg_high": 100, "live_msg_low": 50, "prefetch": 7},
            "destinations": {"/queue/x": {"send_timeout_ms": 0}},
            "broker": {"gateways": 4},
        }
    )
    effective, ignored = reload_flow_settings(old, new)
    assert effective.vol_queue_store.msg_high == 10
    assert effective.topics.live_msg_high == 100
    assert effective.destinations == new.destinations
    assert effective.topics.prefetch == old.topics.prefetch  # needs a restart
    assert effective.broker == old.broker
    assert sorted(ignored) == ["broker.gateways", "topics.prefetch"]


def test_a_destination_limit_above_its_stores_global_limit_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        config_from_mapping(
            {"destinations": {"/queue/x": {"byte_high": "20MiB", "byte_low": "1MiB"}}}
        )
    assert info.value.key == 'destinations."/queue/x".byte_high'
    assert "must not exceed vol_queue_store.global_byte_high = 16777216" in str(info.value)


def test_max_message_bytes_above_the_frame_limit_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        config_from_mapping({"memory": {"max_message_bytes": "2MiB"}})
    assert info.value.key == "memory.max_message_bytes"
    assert "must not exceed stomp.max_frame_bytes = 1048576" in str(info.value)


def test_a_temp_store_limit_below_one_allocation_unit_is_refused() -> None:
    # ActiveMQ's trap: a temp limit below its journal file size blocked producers forever.
    with pytest.raises(ConfigError, match=r"temp_store\.limit_bytes = 1048576: below temp_store"):
        config_from_mapping({"temp_store": {"limit_bytes": "1MiB", "segment_bytes": "8MiB"}})
    config = config_from_mapping({"temp_store": {"limit_bytes": "8MiB", "segment_bytes": "8MiB"}})
    assert config.temp_store.limit_bytes == 8 * 1024 * 1024
    assert config_from_mapping({"temp_store": {"limit_bytes": -1}}).temp_store.limit_bytes == -1


def test_a_throttle_level_above_the_memwatch_levels_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"memory\.throttle_level = 3: there are only 2 levels"):
        config_from_mapping({"memory": {"throttle_level": 3}})


def test_new_destinations_are_refused_from_a_share_of_max_memory() -> None:
    assert config_from_mapping({}).memory.refuse_destinations_percent == 95
    off = config_from_mapping({"memory": {"refuse_destinations_percent": 0}})
    assert off.memory.refuse_destinations_percent == 0
    with pytest.raises(ConfigError, match=r"memory\.refuse_destinations_percent"):
        config_from_mapping({"memory": {"refuse_destinations_percent": 101}})


def test_max_destinations_is_zero_derived_or_a_count() -> None:
    assert config_from_mapping({}).broker.max_destinations == 0
    assert config_from_mapping({"broker": {"max_destinations": 500}}).broker.max_destinations == 500
    with pytest.raises(ConfigError, match=r"broker\.max_destinations"):
        config_from_mapping({"broker": {"max_destinations": -1}})


def test_a_quota_named_for_topics_only_is_refused_naming_the_table() -> None:
    quotas = {"quotas": {"q": {"max_messages": 10}}}
    error = refused({**quotas, "destinations": {"/topic/prices.*": {"quota": "q"}}})
    assert error.key == 'destinations."/topic/prices.*".quota'
    assert "quotas apply to queues only" in str(error)
    config_from_mapping({**quotas, "destinations": {"/queue/orders.*": {"quota": "q"}}})


@pytest.mark.parametrize("value", ["64MiB", 67108864, "5%", "0"])
def test_the_disk_free_limit_is_a_size_or_a_share(value: object) -> None:
    config = config_from_mapping({"store": {"disk_free_limit_bytes": value}})
    assert config.store.disk_free_limit_bytes == str(value)


@pytest.mark.parametrize("value", ["lots", "100%", True])
def test_a_bad_disk_free_limit_is_refused_naming_it(value: object) -> None:
    assert refused({"store": {"disk_free_limit_bytes": value}}).key == "store.disk_free_limit_bytes"


@pytest.mark.parametrize(
    ("value", "stored", "anonymous"),
    [(True, "true", True), (False, "false", False), ("auto", "auto", False)],
)
def test_allow_anonymous_takes_a_boolean_or_auto(
    value: object, stored: str, anonymous: bool
) -> None:
    with_users = config_from_mapping({"security": {"allow_anonymous": value, "users_file": "u"}})
    assert with_users.security.allow_anonymous == stored
    assert with_users.security.anonymous() is anonymous
    if value is not False:  # (false without a users file is refused: it protects nothing)
        config = config_from_mapping({"security": {"allow_anonymous": value}})
        assert config.security.anonymous() is True


# -- STOMP over WebSocket ----------------------------------------------------------------


def test_the_websocket_listeners_are_off_by_default_and_take_port_0() -> None:
    stomp = config_from_mapping({}).stomp
    assert (stomp.ws_port, stomp.wss_port, stomp.ws_allowed_origins) == (-1, -1, "")
    stomp = load_config_text("[stomp]\nws_port = 0\nws_allowed_origins = '*'\n").stomp
    assert stomp.ws_port == 0 and stomp.ws_allowed_origins == "*"


def test_wss_needs_the_tls_files() -> None:
    with pytest.raises(ConfigError) as info:
        load_config_text("[stomp]\nwss_port = 0\n")
    assert str(info.value) == (
        "config: stomp.tls_cert_file = '': required by stomp.wss_port = 0 (a PEM file; "
        "-1 = no TLS listener)"
    )
    # With them, and no tls_port: the files serve wss alone.
    config = load_config_text(
        "[stomp]\nwss_port = 0\ntls_cert_file = 'c.pem'\ntls_key_file = 'k.pem'\n"
    )
    assert config.stomp.tls_port == -1


def test_two_listeners_on_one_port_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"stomp\.ws_port = 61613: must differ from broker\.port"):
        load_config_text("[stomp]\nws_port = 61613\n")
    with pytest.raises(
        ConfigError, match=r"stomp\.wss_port = 9000: must differ from stomp\.ws_port"
    ):
        load_config_text(
            "[stomp]\nws_port = 9000\nwss_port = 9000\ntls_cert_file = 'c'\ntls_key_file = 'k'\n"
        )


def test_allowed_origins_must_be_origins_and_need_a_websocket_port() -> None:
    with pytest.raises(ConfigError) as info:
        load_config_text("[stomp]\nws_port = 0\nws_allowed_origins = 'app.example.com'\n")
    assert info.value.key == "stomp.ws_allowed_origins"
    assert "'app.example.com' is not an origin" in str(info.value)
    with pytest.raises(
        ConfigError, match=r"has no effect without stomp\.ws_port or stomp\.wss_port"
    ):
        load_config_text("[stomp]\nws_allowed_origins = 'https://a.example'\n")


@pytest.mark.parametrize(
    ("settings", "limit"),
    [
        ("", 1000),  # the defaults: max_connections 10000
        ("max_connections = 50\n", 25),  # a default config is valid for any max_connections
        ("max_connections = 50\nmax_connections_connecting = 10\n", 10),
        ("max_connections = 50\nmax_connections_connecting = 50\n", 25),
        ("max_connections = 3\n", 1),
        ("max_connections = 1\n", 1),  # at least one, or nobody could connect
    ],
)
def test_the_connecting_limit_stays_below_max_connections(settings: str, limit: int) -> None:
    assert load_config_text(f"[broker]\n{settings}").broker.connecting_limit() == limit
