"""The gateway's compiled loops: where each stops for the shell, and what it leaves done."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from mpbroker.config import Config, config_from_mapping
from mpbroker.flow import FlowGate
from mpbroker.records import (
    ConnClosed,
    Deliver,
    Receipt,
    Record,
    Send,
    decode,
    encode,
    encode_payload,
)
from mpbroker.session import Admission, GatewaySession, Pacer
from mpbroker.shm import MIN_CAPACITY, Ring, RingWriter, segment_name
from mpbroker.stomp import Frame
from mpbroker.workers._gateway_loops import (
    RUN_DENIED,
    RUN_DONE,
    RUN_REFUSED,
    RUN_SHELL,
    Frames,
    deliver_run,
    post_run,
    receive_run,
)
from tests import factories
from tests.session.test_session import (
    NOW,
    TOPOLOGY,
    as_user,
    connected,
    frame,
    frames,
    new_session,
    routes,
    subscribed,
)


def admission(config: Config | None = None) -> Admission:
    return Admission(config or Config(), FlowGate(TOPOLOGY))


def sends(*destinations: str) -> list[Frame]:
    return [frame("SEND", b"x", destination=d) for d in destinations]


def sent_to(session: GatewaySession) -> list[str]:
    return [r.message.destination for _, r in routes(session) if isinstance(r, Send)]


def test_every_frame_of_a_connected_session_that_may_go_is_handled() -> None:
    session = connected()
    batch = [*sends("/queue/a", "/queue/b"), frame("SUBSCRIBE", id="s", destination="/queue/c")]
    assert receive_run(session, batch, 0, NOW, admission(), 0, Pacer()) == (3, RUN_DONE)
    assert [type(r).__name__ for _, r in routes(session)] == ["Send", "Send", "Subscribe"]


def test_it_starts_where_it_is_told() -> None:
    session = connected()
    batch = sends("/queue/a", "/queue/b", "/queue/c")
    assert receive_run(session, batch, 1, NOW, admission(), 0, Pacer()) == (3, RUN_DONE)
    assert sent_to(session) == ["/queue/b", "/queue/c"]


def test_a_session_not_yet_connected_is_left_to_the_shell() -> None:
    # CONNECT is authenticated by the shell (it waits for a scrypt check in a thread).
    session = new_session()
    batch = [frame("CONNECT", accept_version="1.2", host="h"), *sends("/queue/a")]
    assert receive_run(session, batch, 0, NOW, admission(), 0, Pacer()) == (0, RUN_SHELL)
    assert frames(session) == []


def test_a_send_flow_control_may_hold_is_left_to_the_shell() -> None:
    session = connected()
    config = config_from_mapping({"memory": {"throttle_level": 2}})
    batch = sends("/queue/a", "/queue/b")
    # MemWatch throttles: every SEND goes the shell's way, which may pace it.
    assert receive_run(session, batch, 0, NOW, admission(config), 2, Pacer()) == (0, RUN_SHELL)
    assert receive_run(session, batch, 0, NOW, admission(config), 0, Pacer()) == (2, RUN_DONE)


def test_a_session_that_stops_reading_is_left_to_the_shell() -> None:
    session = connected()
    batch = [frame("DISCONNECT"), *sends("/queue/a")]
    assert receive_run(session, batch, 0, NOW, admission(), 0, Pacer()) == (1, RUN_SHELL)
    assert not session.accepts_frames()
    assert sent_to(session) == []


def test_a_send_its_user_may_not_write_stops_the_run_refused() -> None:
    session = as_user("alice")
    batch = sends("/queue/orders.eu", "/queue/payments", "/queue/orders.us")
    assert receive_run(session, batch, 0, NOW, admission(), 0, Pacer()) == (1, RUN_REFUSED)
    assert session.denial == "access denied: user alice may not write /queue/payments"
    assert sent_to(session) == ["/queue/orders.eu"]


def test_another_frame_denied_stops_the_run_after_it_for_the_log() -> None:
    session = as_user("alice")
    batch = [frame("SUBSCRIBE", id="s", destination="/topic/news"), *sends("/queue/orders.eu")]
    assert receive_run(session, batch, 0, NOW, admission(), 0, Pacer()) == (1, RUN_DENIED)
    assert session.denial == "access denied: user alice may not read /topic/news"


@dataclass(eq=False)
class _Conn:
    session: GatewaySession


def test_deliveries_stop_at_a_record_of_another_kind_and_go_on_after_it() -> None:
    session = connected()
    sub = subscribed(session, "s", ack="auto")
    conn = _Conn(session)
    message = factories.make_message("m1")
    batch = [
        encode(Deliver([(7, sub.sub)], message)),
        encode(Receipt(7, "r")),
        encode(Deliver([(7, sub.sub), (99, 1)], factories.make_message("m2"))),
    ]
    touched: set[_Conn] = set()
    cache: Frames = {}
    assert deliver_run(batch, 0, {7: conn}, cache, touched) == 1
    assert touched == {conn}
    assert [f.headers["message-id"] for f in frames(session)] == ["m1"]
    # The shell handles the receipt, then the run goes on; connection 99 is gone.
    assert deliver_run(batch, 2, {7: conn}, cache, touched) == 3
    assert [f.headers["message-id"] for f in frames(session)] == ["m2"]
    assert len(cache) == 2  # one frame per message, for every subscriber it reaches


def test_a_message_delivered_in_several_records_is_encoded_once() -> None:
    session = connected()
    first = subscribed(session, "a", ack="auto")
    second = subscribed(session, "b", ack="auto")
    message = factories.make_message("m1")
    batch = [
        encode(Deliver([(7, first.sub)], message)),
        encode(Deliver([(7, second.sub)], message)),
    ]
    cache: Frames = {}
    assert deliver_run(batch, 0, {7: _Conn(session)}, cache, set()) == 2
    [(_, shared)] = cache.values()
    assert list(shared) == ["1.2"]
    assert [f.headers["subscription"] for f in frames(session)] == ["a", "b"]


def test_another_message_with_the_same_id_gets_its_own_frame() -> None:
    # Ids repeat across broker runs (the supervisor's pid may): a stored message and a new
    # one, or a redelivered copy, must not be written with another's headers.
    session = connected()
    sub = subscribed(session, "a", ack="auto")
    new = factories.make_message("ID-1", body=b"new", timestamp_ms=2)
    stored = factories.make_message("ID-1", body=b"old", timestamp_ms=1)
    again = factories.make_message("ID-1", body=b"new", timestamp_ms=2, redelivered=True)
    batch = [encode(Deliver([(7, sub.sub)], m)) for m in (new, stored, again)]
    assert deliver_run(batch, 0, {7: _Conn(session)}, {}, set()) == 3
    written = frames(session)
    assert [f.body for f in written] == [b"new", b"old", b"new"]
    assert [f.headers.get("redelivered") for f in written] == [None, None, "true"]


class _Port:
    """A gateway port as post_run sees it: a real ring's writer, a backlog, a dirty flag."""

    def __init__(self, writer: RingWriter) -> None:
        self.writer = writer
        self.dirty = False
        self.backlog: deque[tuple[int, bytes]] = deque()


@pytest.fixture
def ring() -> Iterator[Ring]:
    ring = Ring.create(segment_name(f"{os.getpid()}loops", "ring"), MIN_CAPACITY)
    yield ring
    ring.close()
    ring.unlink()


def test_records_are_staged_while_the_ring_has_room(ring: Ring) -> None:
    port = _Port(ring.writer())
    routes: list[tuple[int, Record]] = [(0, ConnClosed(1)), (0, ConnClosed(2))]
    assert post_run(routes, 0, [port]) == (2, b"")
    assert port.dirty
    port.writer.publish()
    assert [decode(k, p) for k, p in ring.reader().read_batch()] == [ConnClosed(1), ConnClosed(2)]


def test_a_port_with_records_waiting_leaves_the_rest_to_the_shell(ring: Ring) -> None:
    port = _Port(ring.writer())
    port.backlog.append((ConnClosed.kind, b"earlier"))
    assert post_run([(0, ConnClosed(1))], 0, [port]) == (0, b"")
    assert not port.dirty


def test_a_full_ring_hands_the_shell_the_payload_it_may_have_begun(ring: Ring) -> None:
    port = _Port(ring.writer())
    big = Send(1, factories.make_message(body=b"x" * (MIN_CAPACITY // 2)))
    at, payload = post_run([(0, big), (0, big), (0, big)], 0, [port])
    assert (at, payload) == (1, encode_payload(big))
