"""Admission: which SENDs flow control holds, paces or refuses. Pure decisions."""

from __future__ import annotations

import pytest

from mpbroker.config import config_from_mapping
from mpbroker.flow import STORE_MEMORY, STORE_VOLATILE_QUEUES, FlowGate, Stop
from mpbroker.records import FlowState
from mpbroker.routing import Topology
from mpbroker.session import MEMORY_PACE, Admission, Pacer, SessionState, flow_controlled
from mpbroker.stomp import Frame

TOPOLOGY = Topology(p2p=1, pubsub=1)


def send(destination: str = "/queue/q", body: bytes = b"x", **headers: str) -> Frame:
    return Frame("SEND", {"destination": destination, **headers}, body)


def admission(**memory: object) -> Admission:
    config = config_from_mapping(
        {
            "memory": {"throttle_level": 2, "socket_reader_threshold_bytes": 4096, **memory},
            "destinations": {"/queue/paced*": {"flow_control": True}},
        }
    )
    return Admission(config, FlowGate(TOPOLOGY))


@pytest.mark.parametrize(
    ("state", "frame", "expected"),
    [
        (SessionState.CONNECTED, send(), True),
        (SessionState.CONNECTED, send(transaction="tx"), False),
        (SessionState.CONNECTED, Frame("ACK", {"id": "1/m"}), False),
        (SessionState.AWAITING_CONNECT, send(), False),
    ],
)
def test_only_sends_outside_transactions_of_connected_sessions_are_flow_controlled(
    state: SessionState, frame: Frame, expected: bool
) -> None:
    assert flow_controlled(state, frame) is expected


def test_a_stopped_destination_holds_its_sends_until_released() -> None:
    gate = admission()
    assert gate.stop_for(send(), memory_level=0) is None
    gate.flow.apply(FlowState(0, STORE_VOLATILE_QUEUES, "/queue/q", "msg_high 5"))
    stop = gate.stop_for(send(), memory_level=0)
    assert stop is not None
    assert (stop.destination, stop.store, stop.reason) == (
        "/queue/q",
        STORE_VOLATILE_QUEUES,
        "msg_high 5",
    )
    assert gate.stop_for(send("/queue/other"), memory_level=0) is None
    # A persistent message is kept elsewhere: that store's limits hold it, not these.
    assert gate.stop_for(send(persistent="true"), memory_level=0) is None
    gate.flow.apply(FlowState(0, STORE_VOLATILE_QUEUES, "/queue/q", ""))
    assert gate.stop_for(send(), memory_level=0) is None


def test_a_large_message_waits_while_memory_is_short() -> None:
    gate = admission()
    big = send(body=b"x" * 4097)
    assert gate.stop_for(big, memory_level=1) is None
    assert gate.stop_for(send(body=b"x" * 4096), memory_level=2) is None
    stop = gate.stop_for(big, memory_level=2)
    assert stop is not None and stop.store == STORE_MEMORY
    assert stop.reason.startswith("throttle_level 2 (MemWatch level 2; a 4097-byte message")
    # throttle_level 0: never.
    assert admission(throttle_level=0).stop_for(big, memory_level=9) is None


def test_the_refusal_names_the_destination_the_limit_and_the_send_timeout() -> None:
    gate = admission()
    refusal = gate.refusal(send(), Stop("/queue/q", STORE_VOLATILE_QUEUES, "msg_high 5"))
    assert refusal.message == "ResourceAllocation: /queue/q msg_high 5 reached"
    assert refusal.detail == (
        "The message was not accepted: its destination stayed over "
        "vol_queue_store.msg_high for send_timeout_ms 10000."
    )
    whole = gate.refusal(send(), Stop("", STORE_VOLATILE_QUEUES, "global_msg_high 9"))
    assert "the store stayed over vol_queue_store.global_msg_high" in whole.detail
    assert gate.send_timeout_s(send()) == 10.0


def test_memory_pacing_is_armed_from_the_throttle_level() -> None:
    gate = admission()
    assert gate.memory_pace(1)[:2] == (MEMORY_PACE, False)
    assert gate.memory_pace(2)[:2] == (MEMORY_PACE, True)


def test_rate_pacing_only_for_destinations_with_flow_control_armed_by_their_stop() -> None:
    gate = admission()
    assert gate.rate_pace(send("/queue/q")) is None
    pace = gate.rate_pace(send("/queue/paced"))
    assert pace is not None and pace[:2] == ("/queue/paced", False)
    gate.flow.apply(FlowState(0, STORE_VOLATILE_QUEUES, "/queue/paced", "msg_high 5"))
    pace = gate.rate_pace(send("/queue/paced"))
    assert pace is not None and pace[:2] == ("/queue/paced", True)


def test_a_pacer_slows_an_armed_producer_and_lets_it_go_once_recovered() -> None:
    gate = admission()
    pacer = Pacer()
    calm = gate.memory_pace(0)
    assert pacer.delay(calm, now=0.0) is None  # never armed: not paced
    armed = gate.memory_pace(2)
    assert pacer.delay(armed, now=0.0) == 0.0  # the first message goes at once
    pacer.sent(MEMORY_PACE, 0.0)
    delay = pacer.delay(armed, now=0.0)
    # flow_maximum 500/s: the next turn is 2 ms later.
    assert delay == pytest.approx(1 / 500)
    pacer.sent(MEMORY_PACE, 0.002)
    # Armed for two of its ten 6-second steps, the rate decays towards flow_minimum...
    slower = pacer.delay(armed, now=12.0)
    assert slower == 0.0  # its last message went long ago
    pacer.sent(MEMORY_PACE, 12.0)
    decayed = pacer.delay(armed, now=12.0)
    assert decayed is not None and decayed > 1 / 500
    # ...and once disarmed it recovers linearly over flow_interval_s: paced meanwhile...
    assert pacer.delay(calm, now=13.0) is not None
    pacer.sent(MEMORY_PACE, 13.0)
    # ...and not at all once recovered.
    assert pacer.delay(calm, now=1000.0) is None


def test_a_send_goes_at_once_only_when_nothing_could_hold_or_pace_it() -> None:
    gate = admission()
    pacer = Pacer()
    assert gate.admits_at_once(send(), 0, pacer)
    assert not gate.admits_at_once(send(), 2, pacer)  # MemWatch throttles
    assert not gate.admits_at_once(send("/queue/paced"), 0, pacer)  # rate-based flow
    gate.flow.apply(FlowState(0, STORE_VOLATILE_QUEUES, "/queue/other", "msg_high 5"))
    assert not gate.admits_at_once(send(), 0, pacer)  # a stop is in force somewhere
    gate.flow.apply(FlowState(0, STORE_VOLATILE_QUEUES, "/queue/other", ""))
    assert gate.admits_at_once(send(), 0, pacer)
    # A producer still recovering from a pace is looked at until it has recovered.
    pacer.delay(gate.memory_pace(2), now=0.0)
    pacer.sent(MEMORY_PACE, 0.0)
    pacer.delay(gate.memory_pace(2), now=12.0)  # armed long enough to slow it down
    assert not pacer.idle and not gate.admits_at_once(send(), 0, pacer)
    assert pacer.delay(gate.memory_pace(0), now=13.0) is not None  # disarmed, recovering
    assert not gate.admits_at_once(send(), 0, pacer)
    assert pacer.delay(gate.memory_pace(0), now=1000.0) is None
    assert pacer.idle and gate.admits_at_once(send(), 0, pacer)
