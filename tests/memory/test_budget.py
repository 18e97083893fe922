"""The memory budget arithmetic: module lines, the theoretical maximum, the check, the estimate."""

from __future__ import annotations

import pytest

from mpbroker.config import Config, KiB, MiB, config_from_mapping, format_bytes
from mpbroker.memory import (
    DESTINATION_SHARE,
    FIXED_COST_BYTES,
    MIN_DESTINATIONS,
    PER_CONNECTION_BYTES,
    PER_DESTINATION_BYTES,
    PER_ENTRY_BYTES,
    PER_MESSAGE_BYTES,
    PER_SUBSCRIPTION_BYTES,
    RING_HEADER_BYTES,
    check,
    estimate,
    max_destinations,
    plan,
)
from mpbroker.memory import _budget as budget
from mpbroker.routing import Topology
from mpbroker.workers._layout import Layout

PROCESS = FIXED_COST_BYTES["gateway"]


def config(**sections: dict[str, object]) -> Config:
    """A config with two gateways (not one per CPU: the tests do not depend on the machine)."""
    data: dict[str, dict[str, object]] = {"broker": {"gateways": 2}}
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return config_from_mapping(data)


def lines(c: Config) -> dict[str, budget.Budget]:
    return {b.module: b for b in plan(c).budgets}


def test_the_default_budgets_are_the_seeds_modules_on_our_settings() -> None:
    got = {m: (b.count, b.each) for m, b in lines(config()).items()}
    stub, entry = PER_ENTRY_BYTES, PER_MESSAGE_BYTES
    assert got == {
        "socket reader threshold": (2, 64 * KiB),
        "uncommitted transactions": (2, 2 * MiB),
        "storage processing buffer": (2, 128 * KiB),
        "thread/buffer (rings)": (10, 1 * MiB + 4 * KiB),
        "worker statistics": (5, 256 * KiB),
        # The byte marks plus an entry for each message the global counts let wait:
        # topics.global_live_msg_high 20000 (stubs without headers), and, with their
        # headers, vol_queue_store.global_msg_high 60000 and pers_queue_store.global_msg_high
        # 40000 (the 1000 in the index cache among them).
        "topic live buffers": (1, 4 * MiB + 20000 * stub),
        "queue live buffer, persistent": (1, MiB + 40000 * entry),
        "VolQueueStore (non-persistent)": (1, 16 * MiB + 60000 * entry),
        # broker.max_destinations 0: derived from what the rest leaves (below).
        "destinations": (max_destinations(config()), PER_DESTINATION_BYTES),
        # Both kinds of pipeline page (non-persistent queue messages, topic live buffers).
        "temp store paging step": (2, MiB),
        # 4 per pipeline, a durable registry per pubsub worker, a registry and a segment per
        # partition the replay worker serves.
        "SQLite page caches": (4 * 2 + 1 + 2, 256 * KiB),
        "durable replay": (1, 2 * MiB),
        "replay concurrency (thread pools)": (4, 256 * KiB),
    }
    assert all(b.total == b.count * b.each for b in lines(config()).values())


def test_the_maximum_is_the_fixed_cost_plus_every_counted_budget() -> None:
    memory = plan(config())
    counted = [b for b in memory.budgets if b.counted]
    assert [b.module for b in memory.budgets if not b.counted] == [
        "replay concurrency (thread pools)"
    ]
    assert memory.budget_total == sum(b.total for b in counted)
    # supervisor, fork server, 2 gateways, p2p, pubsub, replay
    assert memory.process_count == 7
    assert memory.fixed_cost == sum(FIXED_COST_BYTES[r] for r in FIXED_COST_BYTES) + PROCESS
    assert memory.maximum == memory.fixed_cost + memory.budget_total
    assert memory.headroom == 256 * MiB - memory.maximum


def test_the_default_config_fits_in_the_default_max_memory() -> None:
    assert check(Config()) is None
    assert check(config()) is None
    assert plan(config()).headroom > 0


@pytest.mark.parametrize(("gateways", "p2p", "pubsub"), [(1, 1, 1), (2, 1, 1), (3, 2, 4)])
def test_the_rings_are_those_the_supervisor_creates(gateways: int, p2p: int, pubsub: int) -> None:
    c = config(broker={"gateways": gateways, "p2p_workers": p2p, "pubsub_workers": pubsub})
    layout = Layout("1", gateways, Topology(p2p, pubsub, "DLQ."))
    names = {
        name
        for pipe in range(p2p + pubsub)
        for g in range(gateways)
        for name in (layout.to_pipeline(g, pipe), layout.to_gateway(pipe, g))
    }
    names |= {
        name
        for pipe in range(p2p, p2p + pubsub)
        for name in (layout.to_replay(pipe), layout.from_replay(pipe))
    }
    rings = lines(c)["thread/buffer (rings)"]
    assert rings.count == len(names) == budget.ring_count(c)
    assert rings.each == c.rings.capacity_bytes + RING_HEADER_BYTES


def test_the_ring_header_is_the_rings_format_constant() -> None:
    from mpbroker.shm import _ring

    assert RING_HEADER_BYTES == _ring.HEADER_BYTES


def test_every_process_role_has_a_fixed_cost() -> None:
    roles = [p.role for p in budget.process_costs(1, 1, 1, 1)]
    assert roles == list(FIXED_COST_BYTES)
    assert all(cost > 0 for cost in FIXED_COST_BYTES.values())


def test_the_instances_follow_the_process_counts() -> None:
    c = config(broker={"gateways": 3, "p2p_workers": 2, "pubsub_workers": 4}, replay={"workers": 2})
    got = {m: b.count for m, b in lines(c).items()}
    assert got["socket reader threshold"] == got["uncommitted transactions"] == 3
    assert got["storage processing buffer"] == 6
    assert got["queue live buffer, persistent"] == got["VolQueueStore (non-persistent)"] == 2
    assert got["topic live buffers"] == 4
    assert got["worker statistics"] == 3 + 6 + 2
    assert got["durable replay"] == 2
    assert got["temp store paging step"] == 6  # every pipeline pages
    assert got["SQLite page caches"] == 4 * 6 + 4 + 2 * 4
    # Two replay workers share replay.global_bytes (each at least a batch).
    assert lines(c)["durable replay"].each == MiB
    assert plan(c).process_count == 2 + 3 + 2 + 4 + 2


def test_durable_replay_holds_at_least_one_largest_message() -> None:
    c = config(
        stomp={"max_frame_bytes": 4 * MiB},
        rings={"capacity_bytes": 8 * MiB},
        memory={"max_message_bytes": 3 * MiB},
    )
    assert lines(c)["durable replay"].each == 3 * MiB


def test_vol_queue_store_falls_back_to_the_hard_cap_and_counts_paged_messages() -> None:
    c = config(vol_queue_store={"global_byte_high": -1, "global_byte_low": -1})
    vol = lines(c)["VolQueueStore (non-persistent)"]
    assert (vol.each, vol.settings) == (
        24 * MiB + 60000 * PER_MESSAGE_BYTES,
        ("queues.max_bytes", "vol_queue_store.global_msg_high"),
    )
    c = config(vol_queue_store={"global_msg_high": 90000, "global_msg_low": 70000})
    vol = lines(c)["VolQueueStore (non-persistent)"]
    assert vol.each == 16 * MiB + 90000 * PER_MESSAGE_BYTES
    assert vol.arithmetic == f"1 p2p worker x (16 MiB + 90000 x {PER_MESSAGE_BYTES} B)"
    assert "vol_queue_store.global_msg_high" in vol.settings
    # Without a global count the entries are bounded per queue only: not in the budget, and
    # the line says how to count them.
    c = config(vol_queue_store={"global_msg_high": -1, "global_msg_low": -1})
    vol = lines(c)["VolQueueStore (non-persistent)"]
    assert (vol.each, vol.settings) == (16 * MiB, ("vol_queue_store.global_byte_high",))
    assert "set vol_queue_store.global_msg_high to count them" in vol.why


def test_index_entries_beyond_the_cache_count_when_the_store_bounds_them() -> None:
    c = config(pers_queue_store={"global_msg_high": 110000, "global_msg_low": 100000})
    persistent = lines(c)["queue live buffer, persistent"]
    # Every waiting stored message keeps its entry and headers, the 1000 cached their
    # bodies too (within the cache's bytes), the other 109000 not.
    assert persistent.each == MiB + 110000 * PER_MESSAGE_BYTES
    assert persistent.arithmetic == f"1 p2p worker x (1 MiB + 110000 x {PER_MESSAGE_BYTES} B)"
    assert persistent.settings == ("store.index_cache_bytes", "pers_queue_store.global_msg_high")
    # A count within the cache adds nothing beyond it.
    c = config(
        pers_queue_store={
            "msg_high": 500,
            "msg_low": 400,
            "global_msg_high": 500,
            "global_msg_low": 400,
        }
    )
    persistent = lines(c)["queue live buffer, persistent"]
    assert persistent.each == MiB + 1000 * PER_MESSAGE_BYTES
    assert persistent.settings == ("store.index_cache_bytes", "store.index_cache_entries")
    # Unbounded over the store: bounded per queue only, and not counted.
    c = config(pers_queue_store={"global_msg_high": -1, "global_msg_low": -1})
    persistent = lines(c)["queue live buffer, persistent"]
    assert persistent.each == MiB + 1000 * PER_MESSAGE_BYTES
    assert "set pers_queue_store.global_msg_high to count them" in persistent.why


def test_no_paging_no_paging_step() -> None:
    assert "temp store paging step" not in lines(config(temp_store={"limit_bytes": -1}))


def test_topic_live_buffers_fall_back_to_messages_times_the_largest() -> None:
    c = config(
        topics={"global_live_byte_high": -1, "global_live_byte_low": -1},
        memory={"max_message_bytes": 10 * KiB},
    )
    topic = lines(c)["topic live buffers"]
    assert c.topics.global_live_msg_high == 20000
    assert topic.each == 20000 * 10 * KiB
    assert topic.settings == ("topics.global_live_msg_high", "memory.max_message_bytes")


def test_unbounded_topic_live_buffers_are_refused() -> None:
    c = config(
        topics={
            "global_live_byte_high": -1,
            "global_live_byte_low": -1,
            "global_live_msg_high": -1,
            "global_live_msg_low": -1,
        }
    )
    assert not lines(c)["topic live buffers"].bounded
    problem = check(c)
    assert problem is not None
    assert "topics.global_live_byte_high" in problem
    assert "cannot be computed" in problem


def test_an_over_budget_config_is_refused_naming_the_modules_and_the_excess() -> None:
    c = config(
        stomp={"max_frame_bytes": 16 * MiB},
        rings={"capacity_bytes": 64 * MiB},
    )
    memory = plan(c)
    excess = memory.maximum - 256 * MiB
    assert excess > 0
    problem = check(c)
    assert problem is not None
    assert f"exceeds memory.max_memory = 256 MiB by {format_bytes(excess)}" in problem
    assert (
        "thread/buffer (rings) 640.04 MiB (10 rings x (64 MiB + 4 KiB): rings.capacity_bytes)"
        in (problem)
    )
    assert "Lower rings.capacity_bytes" in problem
    assert f"raise memory.max_memory to at least {format_bytes(memory.maximum)}" in problem
    # The rings alone cover the excess: no other module is blamed.
    assert "VolQueueStore" not in problem


def test_the_refusal_names_as_many_modules_as_the_excess_needs() -> None:
    c = config(memory={"max_memory": "160MiB"}, rings={"capacity_bytes": "4MiB"})
    memory = plan(c)
    by_size = sorted((b for b in memory.budgets if b.counted), key=lambda b: -b.total)
    assert [b.module for b in by_size[:3]] == [
        "VolQueueStore (non-persistent)",
        "thread/buffer (rings)",
        "queue live buffer, persistent",
    ]
    # The largest alone does not cover the excess, the two largest do.
    excess = -memory.headroom
    assert by_size[0].total < excess <= by_size[0].total + by_size[1].total
    problem = check(c)
    assert problem is not None
    assert "thread/buffer (rings)" in problem and "VolQueueStore (non-persistent)" in problem
    assert "queue live buffer, persistent" not in problem
    assert "topic live buffers" not in problem


def test_the_rendered_table_shows_every_line_and_the_totals() -> None:
    memory = plan(config())
    text = "\n".join(budget.render_plan(memory))
    for b in memory.budgets:
        assert b.module in text and b.arithmetic in text
    assert "10 rings x (1 MiB + 4 KiB)" in text
    assert "(1 MiB)" in text  # replay concurrency: shown, not added
    assert format_bytes(memory.maximum) in text
    assert "python -m bench.fixedcost" in text
    assert "consumer windows" in text


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (746, "746 B"),
        (1024, "1 KiB"),
        (1536, "1.5 KiB"),
        (10000, "10 kB"),
        (64 * KiB, "64 KiB"),
        (1310720, "1.25 MiB"),
        (2 * MiB, "2 MiB"),
        (20_000_000, "20 MB"),
        (256_000_000, "256 MB"),
        (20017152, "19.09 MiB"),
        (1 << 30, "1 GiB"),
    ],
)
def test_format_bytes(n: int, text: str) -> None:
    assert format_bytes(n) == text


# -- destinations ----------------------------------------------------------------------------


def test_the_derived_destinations_take_half_of_what_the_rest_leaves() -> None:
    c = config()
    memory = plan(c)
    line = lines(c)["destinations"]
    assert c.broker.max_destinations == 0
    rest = memory.maximum - line.total  # the fixed cost and every other line
    room = 256 * MiB - rest
    assert (
        line.count
        == max_destinations(c)
        == int(room * DESTINATION_SHARE) // (PER_DESTINATION_BYTES)
    )
    # The other half stays headroom (within one destination's rounding).
    assert 0 <= memory.headroom - room * (1 - DESTINATION_SHARE) < PER_DESTINATION_BYTES
    assert "derived" in line.why and line.settings == ("broker.max_destinations",)
    assert check(c) is None
    # More memory, more destinations.
    assert max_destinations(config(memory={"max_memory": "1GiB"})) > 4 * line.count


def test_a_set_max_destinations_is_counted_and_must_fit() -> None:
    c = config(broker={"max_destinations": 1000})
    assert max_destinations(c) == 1000
    line = lines(c)["destinations"]
    assert (line.count, line.total) == (1000, 1000 * PER_DESTINATION_BYTES)
    assert check(c) is None
    too_many = config(broker={"max_destinations": 1_000_000})
    problem = check(too_many)
    assert problem is not None
    assert "destinations " in problem and "broker.max_destinations" in problem
    assert "Lower broker.max_destinations" in problem


def test_the_derived_destinations_are_at_least_the_minimum() -> None:
    # A budget with no room left: the derived limit is the floor (and the config is refused
    # for the other modules anyway).
    c = config(memory={"max_memory": "160MiB"})
    assert max_destinations(c) == MIN_DESTINATIONS
    assert check(c) is not None


def test_the_estimate_counts_destinations() -> None:
    c = config()
    result = estimate(c, 0, 0, 0, 0, destinations=2000)
    each = format_bytes(PER_DESTINATION_BYTES)
    assert result.terms[-1] == (f"2000 destinations x {each}", 2000 * PER_DESTINATION_BYTES)
    text = "\n".join(result.lines())
    assert f"2000 fit within broker.max_destinations {max_destinations(c)}" in text
    over = estimate(c, 0, 0, 0, 0, destinations=max_destinations(c) + 1)
    assert "exceed broker.max_destinations" in "\n".join(over.lines())


# -- the estimate ----------------------------------------------------------------------------


def test_the_estimate_is_qpids_formula_with_our_unit_costs() -> None:
    c = config()
    result = estimate(c, connections=100, sessions=250, messages=10000, message_bytes=1000)
    values = [n for _, n in result.terms]
    assert values == [
        plan(c).fixed_cost,
        100 * PER_CONNECTION_BYTES,
        250 * PER_SUBSCRIPTION_BYTES,
        10000 * (PER_MESSAGE_BYTES + 1000),
        0,  # no destinations asked about
    ]
    assert result.total == sum(values)
    text = "\n".join(result.lines())
    assert "fits:" in text and "memory.max_memory = 256 MiB" in text
    assert "fit in the VolQueueStore budgets (16 MiB over all p2p workers)" in text


def test_an_estimate_over_max_memory_says_by_how_much() -> None:
    c = config()
    result = estimate(c, connections=0, sessions=0, messages=200_000, message_bytes=1000)
    over = result.total - 256 * MiB
    assert over > 0
    text = "\n".join(result.lines())
    assert f"over by {format_bytes(over)}: memory.max_memory = 256 MiB" in text
    assert "exceed the VolQueueStore budgets" in text


def test_nothing_costs_the_fixed_cost() -> None:
    c = config()
    assert estimate(c, 0, 0, 0, 0).total == plan(c).fixed_cost


def test_the_consumer_window_is_prefetch_messages_at_most_the_byte_window() -> None:
    small = estimate(config(), 1, 1, 1, 100)
    assert small.window_bytes == 1000 * (PER_MESSAGE_BYTES + 100)
    large = estimate(config(), 1, 1, 1, 100_000)
    assert large.window_bytes == 8 * MiB


@pytest.mark.parametrize(
    "field", ["connections", "sessions", "messages", "message_bytes", "destinations"]
)
def test_negative_counts_are_refused(field: str) -> None:
    args = {"connections": 1, "sessions": 1, "messages": 1, "message_bytes": 1}
    args[field] = -1
    with pytest.raises(ValueError, match=f"{field} = -1"):
        estimate(config(), **args)


def test_the_worked_example_in_the_docstring_is_the_default_plan() -> None:
    # When a constant changes, update mpbroker/memory/_budget.py's docstring (and docs/configuration.md).
    memory = plan(config())
    doc = " ".join((budget.__doc__ or "").split())
    for b in memory.budgets:
        total = format_bytes(b.total) if b.counted else f"({format_bytes(b.total)})"
        assert f"{b.module} {b.arithmetic} = {total}" in doc, b.module
    assert f"module budgets = {format_bytes(memory.budget_total)}" in doc
    fixed = " + ".join(
        format_bytes(p.each) if p.count == 1 else f"{p.count} x {format_bytes(p.each)}"
        for p in memory.processes
    )
    assert f"{memory.process_count} processes ({fixed}) = {format_bytes(memory.fixed_cost)}" in doc
    assert f"theoretical maximum = {format_bytes(memory.maximum)}" in doc
    share = f"{100 * memory.headroom / memory.max_memory:.0f} %"
    assert f"{format_bytes(memory.headroom)} headroom ({share})" in doc
