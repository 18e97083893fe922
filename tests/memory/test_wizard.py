"""The configuration wizard: inputs -> budgets (table-driven), refusals, and a property test
that every output is a valid config within its memory, or a refusal that says why."""

from __future__ import annotations

import dataclasses
import math
import tomllib
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from mpbroker.config import Config, KiB, MiB, config_from_mapping, format_bytes, parse_size
from mpbroker.memory import (
    FIXED_COST_BYTES,
    MIN_DESTINATIONS,
    PER_CONNECTION_BYTES,
    PER_DESTINATION_BYTES,
    PER_ENTRY_BYTES,
    PER_MESSAGE_BYTES,
    PER_SUBSCRIPTION_BYTES,
    WizardError,
    WizardInputs,
    WizardResult,
    check,
    derive,
    plan,
)
from mpbroker.memory import _wizard as wizard

# The seed's worked example: 256 MB, 10 topics, 10 queues, 20 MB messages, 50 msg/s,
# 20 connections, 500 threads (on a 2-CPU machine).
SEED = WizardInputs(
    memory_bytes=parse_size("256MB"),
    topics=10,
    queues=10,
    largest_topic_message_bytes=parse_size("20MB"),
    largest_queue_message_bytes=parse_size("20MB"),
    rate_per_s=50,
    connections=20,
    threads=500,
    cpus=2,
)
SMALL = dataclasses.replace(
    SEED, largest_topic_message_bytes=64 * KiB, largest_queue_message_bytes=64 * KiB
)

# Settings the seed's defaults give whatever the memory (the fixed-size modules).
SEED_MODULES = {
    "memory.socket_reader_threshold_bytes": 64 * KiB,
    "transactions.max_uncommitted_bytes": 2 * MiB,
    "store.commit_max_bytes": 128 * KiB,
    "replay.global_bytes": 2 * MiB,
    "replay.replay_bytes": 256 * KiB,
    "replay.workers": 1,
}


def values(result: WizardResult) -> dict[str, Any]:
    return {c.key: c.value for c in result.choices}


def fixed_cost(gateways: int, p2p: int, pubsub: int) -> int:
    f = FIXED_COST_BYTES
    return (
        f["supervisor"]
        + f["fork server"]
        + f["replay"]
        + gateways * f["gateway"]
        + p2p * f["p2p"]
        + pubsub * f["pubsub"]
    )


# The message counts the wizard derives: (section, global count's key, key per destination).
COUNTS = [
    ("vol_queue_store", "global_msg", "msg"),
    ("pers_queue_store", "global_msg", "msg"),
    ("topics", "global_live_msg", "live_msg"),
]


def why(result: WizardResult, key: str) -> str:
    return next(c.why for c in result.choices if c.key == key)


def assert_valid(result: WizardResult) -> None:
    """What every wizard output promises."""
    i, config, memory = result.inputs, result.config, result.plan
    # The TOML it writes is exactly the config it describes, and only the derived settings.
    text = result.toml()
    assert config_from_mapping(tomllib.loads(text)) == config
    for choice in result.choices:
        section, _, name = choice.key.partition(".")
        assert getattr(getattr(config, section), name) == choice.value, choice.key
        assert choice.why and f"# {choice.why}\n{name} = " in text
    # It fits: the theoretical maximum within the memory, about half of what the fixed
    # cost leaves allocated to the budgets, the other half headroom.
    assert check(config) is None
    assert memory == plan(config)
    assert config.memory.max_memory == i.memory_bytes
    pool = (i.memory_bytes - memory.fixed_cost) // 2
    assert 0.49 * pool <= memory.budget_total <= pool
    assert memory.headroom >= i.connections * (PER_CONNECTION_BYTES + PER_SUBSCRIPTION_BYTES)
    # The largest messages get through and fit in their live buffers.
    largest = max(i.largest_topic_message_bytes, i.largest_queue_message_bytes)
    assert config.memory.max_message_bytes == largest
    assert config.stomp.max_frame_bytes >= largest + 16 * KiB
    assert config.vol_queue_store.global_byte_high >= i.largest_queue_message_bytes
    assert config.topics.global_live_byte_high >= i.largest_topic_message_bytes
    # Workers: never more gateways than CPUs or threads.
    broker = config.broker
    assert 1 <= broker.gateways <= min(i.cpus, i.threads)
    assert broker.max_connections == i.connections
    # The rings: 1 MiB (the measured default), 512 or 256 KiB only when the next larger size
    # does not fit with the same processes (they pass larger messages in fragments).
    ring = config.rings.capacity_bytes
    assert ring in (MiB, 512 * KiB, 256 * KiB)
    if ring < MiB:
        assert f"the budgets do not fit with {format_bytes(2 * ring)} rings" in why(
            result, "rings.capacity_bytes"
        )
        layout = wizard._Layout(broker.gateways, broker.p2p_workers, broker.pubsub_workers)
        with pytest.raises(WizardError):
            wizard._derive(i, layout, [*wizard._messages(i), wizard._ring(2 * ring)])
    # The counts that stop producers: 10 minutes at the rate, from 1000 to the default, and
    # lower only when the reason says so; a destination's count within its store's.
    wanted = max(1000, math.ceil(i.rate_per_s * 600))
    for section, keys, dest in COUNTS:
        got, default = getattr(config, section), getattr(Config(), section)
        high, default_high = getattr(got, f"{keys}_high"), getattr(default, f"{keys}_high")
        assert 1000 <= high <= min(wanted, default_high)
        lowered = "lowered from" in why(result, f"{section}.{keys}_high")
        assert lowered == (high < min(wanted, default_high)), section
        assert getattr(got, f"{dest}_high") == min(high, getattr(default, f"{dest}_high"))


# -- table: inputs -> budgets ----------------------------------------------------------------

CASES: list[tuple[str, WizardInputs, dict[str, Any]]] = [
    (
        "the seed's inputs with 64 KiB messages",
        SMALL,
        {
            **SEED_MODULES,
            "broker.gateways": 2,  # 500 threads, 2 CPUs
            "broker.p2p_workers": 1,
            "broker.pubsub_workers": 1,
            "broker.max_connections": 20,
            "memory.max_memory": 256_000_000,
            "memory.max_message_bytes": 64 * KiB,
            "stomp.max_frame_bytes": 80 * KiB,
            "replay.max_concurrent": 4,  # the seed's 4 thread pools for small messages
            "store.index_cache_entries": 1000,  # 50 msg/s x 20 s < the seed's 1000
            "rings.capacity_bytes": MiB,  # the measured default fits
            # 10 min at 50 msg/s: 30000, the topics' default 20000; the queues' lowered so
            # their entries take at most half of the p2p worker's part (which the 100
            # destinations' budget makes a little smaller).
            "topics.global_live_msg_high": 20000,
            "vol_queue_store.global_msg_high": 9900,
            "pers_queue_store.global_msg_high": 9900,
            "broker.max_destinations": 100,
        },
    ),
    (
        "the counts hold 10 minutes at the rate",
        dataclasses.replace(SMALL, memory_bytes=parse_size("2GB"), rate_per_s=20),
        {
            "vol_queue_store.global_msg_high": 12000,
            "vol_queue_store.global_msg_low": 10000,  # the default's 50000 of 60000
            "vol_queue_store.msg_high": 12000,  # within the global count
            "pers_queue_store.global_msg_high": 12000,
            "topics.global_live_msg_high": 12000,
            "topics.global_live_msg_low": 9000,
        },
    ),
    (
        "the counts are at least 1000",
        dataclasses.replace(SMALL, memory_bytes=parse_size("2GB"), rate_per_s=0),
        {
            "vol_queue_store.global_msg_high": 1000,
            "pers_queue_store.global_msg_high": 1000,
            "topics.global_live_msg_high": 1000,
            "topics.live_msg_high": 1000,
        },
    ),
    (
        "the index cache grows with the rate, the counts up to their defaults",
        dataclasses.replace(SMALL, memory_bytes=parse_size("2GB"), rate_per_s=1000),
        {
            "store.index_cache_entries": 20000,
            "replay.max_concurrent": 4,
            "vol_queue_store.global_msg_high": 60000,
            "pers_queue_store.global_msg_high": 40000,
            "topics.global_live_msg_high": 20000,
        },
    ),
    (
        "the threads bound the workers",
        dataclasses.replace(SMALL, memory_bytes=parse_size("1GB"), threads=4, cpus=8),
        {"broker.gateways": 4, "broker.p2p_workers": 2, "broker.pubsub_workers": 2},
    ),
    (
        "the CPUs bound the workers",
        dataclasses.replace(SMALL, memory_bytes=parse_size("1GB"), cpus=4),
        {"broker.gateways": 4, "broker.p2p_workers": 2, "broker.pubsub_workers": 2},
    ),
    (
        "one queue: one p2p worker",
        dataclasses.replace(SMALL, memory_bytes=parse_size("1GB"), queues=1, topics=3, cpus=8),
        {"broker.gateways": 8, "broker.p2p_workers": 1, "broker.pubsub_workers": 3},
    ),
    (
        "thread pools shrink as the largest topic message grows",
        dataclasses.replace(SMALL, largest_topic_message_bytes=512 * KiB),
        {"replay.max_concurrent": 2, "memory.max_message_bytes": 512 * KiB},
    ),
    (
        "one replay at a time for 1 MiB topic messages",
        dataclasses.replace(
            SMALL, memory_bytes=parse_size("512MB"), largest_topic_message_bytes=1 * MiB
        ),
        {"replay.max_concurrent": 1, "stomp.max_frame_bytes": 1 * MiB + 16 * KiB},
    ),
    (
        # What the processes leave does not hold the 2-gateway budgets with 1 MiB rings:
        # smaller rings, before a gateway less.
        "512 KiB rings when 1 MiB ones do not fit",
        dataclasses.replace(SMALL, memory_bytes=fixed_cost(2, 1, 1) + 46 * MiB),
        {"broker.gateways": 2, "rings.capacity_bytes": 512 * KiB},
    ),
    (
        "256 KiB rings when 512 KiB ones do not fit",
        dataclasses.replace(SMALL, memory_bytes=fixed_cost(2, 1, 1) + 39 * MiB),
        {"broker.gateways": 2, "rings.capacity_bytes": 256 * KiB},
    ),
    (
        # Not even with 256 KiB rings: one gateway less, which has room for 1 MiB rings.
        "a gateway less when the memory is short",
        dataclasses.replace(SMALL, memory_bytes=fixed_cost(2, 1, 1) + 35 * MiB),
        {
            "broker.gateways": 1,
            "broker.p2p_workers": 1,
            "broker.pubsub_workers": 1,
            "rings.capacity_bytes": MiB,
        },
    ),
]


@pytest.mark.parametrize(("inputs", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_inputs_give_budgets(inputs: WizardInputs, expected: dict[str, Any]) -> None:
    result = derive(inputs)
    assert_valid(result)
    got = values(result)
    assert {key: got[key] for key in expected} == expected


def test_the_live_buffers_share_what_is_left_by_queues_and_topics() -> None:
    queues = derive(dataclasses.replace(SMALL, queues=30, topics=10))
    topics = derive(dataclasses.replace(SMALL, queues=10, topics=30))
    q_values, t_values = values(queues), values(topics)
    assert (
        q_values["vol_queue_store.global_byte_high"] > t_values["vol_queue_store.global_byte_high"]
    )
    assert q_values["topics.global_live_byte_high"] < t_values["topics.global_live_byte_high"]
    # The counts too, unless at their defaults (the topics' 20000 in both).
    assert q_values["vol_queue_store.global_msg_high"] > t_values["vol_queue_store.global_msg_high"]
    assert q_values["topics.global_live_msg_high"] <= t_values["topics.global_live_msg_high"]
    # 3:1 of the same amount, within rounding: the queues' part (the VolQueueStore and the
    # persistent live buffer, with their entries) against the topics' (bytes and entries).
    totals = {b.module: b.total for b in queues.plan.budgets}
    q = totals["VolQueueStore (non-persistent)"] + totals["queue live buffer, persistent"]
    t = totals["topic live buffers"]
    assert abs(q / t - 3) < 0.05


def test_the_counts_entries_and_bytes_share_each_part() -> None:
    # Plenty of memory: the counts at what the rate asks, the bytes the rest.
    result = derive(dataclasses.replace(SMALL, memory_bytes=parse_size("1GB")))
    got = values(result)
    assert got["vol_queue_store.global_msg_high"] == 30000  # 10 min at 50 msg/s
    assert got["topics.global_live_msg_high"] == 20000  # the default, below 30000
    topic = next(b for b in result.plan.budgets if b.module == "topic live buffers")
    assert topic.each == got["topics.global_live_byte_high"] + 20000 * PER_ENTRY_BYTES
    assert got["topics.global_live_byte_high"] > 20000 * PER_ENTRY_BYTES
    # A queue message keeps its headers (selectors read them), a topic stub does not.
    for section in ("vol_queue_store", "pers_queue_store"):
        assert why(result, f"{section}.global_msg_high").startswith(
            f"every waiting message keeps its entry and headers in memory ({PER_MESSAGE_BYTES} B"
        )
    assert why(result, "topics.global_live_msg_high").startswith(
        f"every waiting message keeps an entry in memory ({PER_ENTRY_BYTES} B"
    )
    # Short: the entries take at most half of the part, and the reason says they were lowered.
    result = derive(SMALL)
    got = values(result)
    assert got["vol_queue_store.global_msg_high"] < 30000
    assert "lowered from 30000 (10 min of messages at 50 msg/s)" in why(
        result, "vol_queue_store.global_msg_high"
    )
    # Queue messages keep their headers: their entries cost what a message does beyond
    # its body.
    entries = (got["vol_queue_store.global_msg_high"] + got["pers_queue_store.global_msg_high"]) * (
        PER_MESSAGE_BYTES
    )
    assert got["vol_queue_store.global_byte_high"] * 17 / 16 >= 0.99 * entries


def test_every_reason_is_written_above_its_setting() -> None:
    result = derive(SMALL)
    text = result.toml()
    assert text.startswith("# Written by `mpbroker config wizard` from: memory 256 MB, ")
    assert "# 500 threads/workers, at most one per CPU (2)\ngateways = 2\n" in text
    assert "[rings]\n# the default, per pipeline direction: with 100 KB messages 1 MiB" in text
    # Only the derived settings: nothing else from the 100-odd settings (gateways, both
    # pipeline counts, max_connections, max_destinations).
    assert len(tomllib.loads(text)["broker"]) == 5


def test_the_destinations_are_twice_the_queues_and_topics_at_least_the_minimum() -> None:
    result = derive(dataclasses.replace(SMALL, queues=300, topics=200))
    assert values(result)["broker.max_destinations"] == 1000
    line = next(b for b in result.plan.budgets if b.module == "destinations")
    assert (line.count, line.each) == (1000, PER_DESTINATION_BYTES)
    assert "2 x the queues and topics expected (500" in why(result, "broker.max_destinations")
    # The seed's 10 and 10: the minimum.
    assert values(derive(SMALL))["broker.max_destinations"] == MIN_DESTINATIONS


def test_the_rings_need_not_carry_the_largest_frame() -> None:
    # What lets the wizard keep its rings whatever the largest message: records larger than
    # a quarter of a ring pass through it in fragments, so the config ties them to nothing.
    config = config_from_mapping(
        {"stomp": {"max_frame_bytes": 64 * MiB}, "rings": {"capacity_bytes": 256 * KiB}}
    )
    assert config.rings.capacity_bytes == 256 * KiB


def test_the_seeds_example() -> None:
    # 20 MB messages in 256 MB: a largest message each in the VolQueueStore, the topic live
    # buffer and the durable replay (57 MiB of the 84 MiB for the budgets), 1 MiB rings, and
    # the counts lowered to what that leaves.
    result = derive(SEED)
    assert_valid(result)
    got = values(result)
    assert got["broker.gateways"] == 2
    assert got["rings.capacity_bytes"] == MiB
    assert got["stomp.max_frame_bytes"] == 20017152  # 20 MB + 16 KiB, in KiB
    assert got["memory.max_message_bytes"] == 20_000_000
    assert got["replay.max_concurrent"] == 1  # 2 MiB over two 20 MB messages: at least 1
    assert got["store.index_cache_entries"] == 1000
    assert {k: got[k] for k in SEED_MODULES} == SEED_MODULES
    durable = next(b for b in result.plan.budgets if b.module == "durable replay")
    assert durable.total == 20_000_000  # holds one largest message
    for key in ("vol_queue_store.global_msg_high", "topics.global_live_msg_high"):
        assert 1000 < got[key] < 20000 and "lowered from" in why(result, key)
    assert got["vol_queue_store.msg_high"] == got["vol_queue_store.global_msg_high"]


# -- refusals: which input, by how much --------------------------------------------------------


@pytest.mark.parametrize(
    ("inputs", "option", "fragments"),
    [
        (
            dataclasses.replace(SMALL, memory_bytes=fixed_cost(1, 1, 1) - MiB),
            "--memory",
            ["below the fixed cost of the smallest broker"],
        ),
        (
            dataclasses.replace(SMALL, connections=100_000),
            "--connections",
            ["more than the headroom", "short by", "lower --connections to"],
        ),
        (
            # (Not 100000 topics: their destinations alone would not fit, and --memory is
            # named.)
            dataclasses.replace(SMALL, queues=1, topics=2000),
            "--largest-queue-message",
            ["the VolQueueStore of each p2p worker gets", "short by", "raise --memory by"],
        ),
        (
            dataclasses.replace(SMALL, queues=2000, topics=1),
            "--largest-topic-message",
            ["the topic live buffer of each pubsub worker gets", "short by"],
        ),
        (dataclasses.replace(SMALL, threads=0), "--threads", ["must be at least 1"]),
        (dataclasses.replace(SMALL, rate_per_s=-1.0), "--rate", ["must be at least 0"]),
        (dataclasses.replace(SMALL, rate_per_s=float("nan")), "--rate", ["must be at least 0"]),
        (dataclasses.replace(SMALL, memory_bytes=0), "--memory", ["must be at least 1"]),
    ],
    ids=["memory", "connections", "queue message", "topic message", "threads", "rate", "nan", "0"],
)
def test_inputs_that_cannot_fit_are_refused_naming_the_input(
    inputs: WizardInputs, option: str, fragments: list[str]
) -> None:
    with pytest.raises(WizardError) as info:
        derive(inputs)
    assert info.value.option == option
    for fragment in fragments:
        assert fragment in info.value.why
    assert str(info.value).startswith(f"wizard: {option} ")


def test_raising_the_memory_by_what_the_refusal_says_is_enough() -> None:
    inputs = dataclasses.replace(SMALL, queues=1, topics=2000)
    with pytest.raises(WizardError) as info:
        derive(inputs)
    more = info.value.why.split("raise --memory by at least ")[1].split(",")[0]
    assert more.endswith("MiB")
    enough = inputs.memory_bytes + int(more.split()[0]) * MiB
    assert_valid(derive(dataclasses.replace(inputs, memory_bytes=enough)))


# -- property: valid and within budget, or refused with a reason -------------------------------

OPTIONS = {
    "--memory",
    "--connections",
    "--largest-queue-message",
    "--largest-topic-message",
    "--largest-topic-message/--largest-queue-message",
}


@given(
    memory=st.integers(50 * MiB, 4096 * MiB),
    topics=st.integers(0, 10_000),
    queues=st.integers(0, 10_000),
    # Mostly sizes and counts that fit, sometimes ones that cannot.
    largest_topic=st.integers(1, 256 * KiB) | st.integers(1, 64 * MiB),
    largest_queue=st.integers(1, 256 * KiB) | st.integers(1, 64 * MiB),
    rate=st.floats(0, 1e6, allow_nan=False),
    connections=st.integers(1, 2000) | st.integers(1, 200_000),
    threads=st.integers(1, 1000),
    cpus=st.integers(1, 64),
)
def test_every_output_is_a_valid_config_within_its_memory_or_a_refusal(
    memory: int,
    topics: int,
    queues: int,
    largest_topic: int,
    largest_queue: int,
    rate: float,
    connections: int,
    threads: int,
    cpus: int,
) -> None:
    inputs = WizardInputs(
        memory, topics, queues, largest_topic, largest_queue, rate, connections, threads, cpus
    )
    try:
        result = derive(inputs)
    except WizardError as exc:
        event(f"refused: {exc.option}")
        assert exc.option in OPTIONS
        assert "short by" in exc.why or "below the fixed cost" in exc.why or "refused" in exc.why
        return
    event("derived")
    assert_valid(result)


def test_the_default_config_is_what_the_wizard_keeps() -> None:
    # The wizard leaves alone what it does not derive: the defaults (which fit).
    result = derive(SMALL)
    untouched = Config()
    assert result.config.admin == untouched.admin
    assert result.config.temp_store == untouched.temp_store
