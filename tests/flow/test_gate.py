"""The gateway's view of flow stops: which SEND waits for which limit."""

from __future__ import annotations

from mpbroker.flow import (
    STORE_LIVE,
    STORE_PERSISTENT_QUEUES,
    STORE_TEMP,
    STORE_TOPICS,
    STORE_VOLATILE_QUEUES,
    FlowGate,
)
from mpbroker.records import FlowState
from mpbroker.routing import Topology

TOPOLOGY = Topology(1, 1)  # pipeline 0: queues, pipeline 1: topics


def test_a_destination_stop_holds_only_sends_of_its_store() -> None:
    gate = FlowGate(TOPOLOGY)
    gate.apply(FlowState(0, STORE_VOLATILE_QUEUES, "/queue/a", "msg_high 10"))
    stop = gate.stop_for("/queue/a", persistent=False)
    assert stop is not None
    assert (stop.destination, stop.store, stop.reason) == (
        "/queue/a",
        STORE_VOLATILE_QUEUES,
        "msg_high 10",
    )
    assert gate.stop_for("/queue/a", persistent=True) is None  # the other store has room
    assert gate.stop_for("/queue/b", persistent=False) is None
    gate.apply(FlowState(0, STORE_VOLATILE_QUEUES, "/queue/a", ""))
    assert gate.stop_for("/queue/a", persistent=False) is None
    assert not gate.stops


def test_a_global_stop_holds_every_destination_of_the_store() -> None:
    gate = FlowGate(TOPOLOGY)
    gate.apply(FlowState(0, STORE_PERSISTENT_QUEUES, "", "global_byte_high 100"))
    for name in ("/queue/x", "/queue/y"):
        stop = gate.stop_for(name, persistent=True)
        assert stop is not None and stop.destination == "" and stop.reason.startswith("global")
        assert gate.stop_for(name, persistent=False) is None
    assert gate.stop_for("/topic/x", persistent=True) is None


def test_a_full_temp_store_holds_only_non_persistent_queue_sends() -> None:
    gate = FlowGate(TOPOLOGY)
    gate.apply(FlowState(0, STORE_TEMP, "", "limit_bytes 1024"))
    stop = gate.stop_for("/queue/x", persistent=False)
    assert stop is not None and (stop.store, stop.reason) == (STORE_TEMP, "limit_bytes 1024")
    assert gate.stop_for("/queue/x", persistent=True) is None
    assert gate.stop_for("/topic/x", persistent=False) is None


def test_topic_sends_wait_for_the_live_buffer_and_persistent_ones_for_the_topic_store() -> None:
    gate = FlowGate(TOPOLOGY)
    gate.apply(FlowState(1, STORE_TOPICS, "/topic/t", "msg_high 5"))
    assert gate.stop_for("/topic/t", persistent=False) is None
    assert gate.stop_for("/topic/t", persistent=True) is not None
    gate.apply(FlowState(1, STORE_LIVE, "/topic/t", "live_msg_high 20"))
    stop = gate.stop_for("/topic/t", persistent=False)
    assert stop is not None and stop.store == STORE_LIVE


def test_a_restarted_pipeline_takes_its_stops_along() -> None:
    gate = FlowGate(TOPOLOGY)
    gate.apply(FlowState(0, STORE_VOLATILE_QUEUES, "/queue/a", "msg_high 10"))
    gate.apply(FlowState(1, STORE_LIVE, "/topic/t", "live_msg_high 20"))
    gate.pipeline_restarted(0)
    assert gate.stop_for("/queue/a", persistent=False) is None
    assert gate.stop_for("/topic/t", persistent=False) is not None


def test_an_unknown_destination_is_left_to_the_session_to_refuse() -> None:
    gate = FlowGate(TOPOLOGY)
    gate.apply(FlowState(0, STORE_VOLATILE_QUEUES, "", "global_msg_high 1"))
    assert gate.stop_for("/nowhere/x", persistent=False) is None
