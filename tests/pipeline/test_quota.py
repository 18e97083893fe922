"""The quota waiting room: SENDs wait for room in their quota, in order, within their send
timeout; one that can never fit is refused at once."""

from __future__ import annotations

from mpbroker.config import config_from_mapping
from mpbroker.engine import Outbox
from mpbroker.flow import QuotaBook
from mpbroker.pipeline import QuotaWaitingRoom, StopChange
from mpbroker.records import Refuse, Send
from tests.factories import make_message

CONFIG = config_from_mapping(
    {
        "stomp": {"max_frame_bytes": 1024, "max_header_bytes": 512},
        "quotas": {"small": {"max_messages": 1, "max_bytes": 1024}},
        "destinations": {"/queue/q*": {"quota": "small", "send_timeout_ms": 100}},
    }
)


def send(n: int, destination: str = "/queue/q", body: bytes = b"x") -> Send:
    return Send(1, make_message(f"m{n}", destination, body=body), f"r{n}")


def room() -> tuple[QuotaWaitingRoom, QuotaBook, Outbox]:
    quotas = QuotaBook(CONFIG)
    outbox = Outbox()
    return QuotaWaitingRoom(quotas, outbox, CONFIG.send_timeout_ms), quotas, outbox


def test_a_send_with_room_goes_at_once_and_the_next_waits_with_its_producers_stopped() -> None:
    waiting_room, quotas, outbox = room()
    assert waiting_room.admit(0, send(1), now_ms=0)
    assert not waiting_room.admit(0, send(2), now_ms=0)
    assert outbox.take() == {}  # waiting, not refused
    admitted, changes = waiting_room.step([], now_ms=50)
    assert admitted == []
    assert changes == [StopChange("/queue/q", "quota small max_messages 1, max_bytes 1024")]
    assert waiting_room.stops() == {"/queue/q": "quota small max_messages 1, max_bytes 1024"}
    # The first message leaves: its room lets the second in, and the producers go again.
    granted = quotas.release("/queue/q", 1, send(1).message.size)
    admitted, changes = waiting_room.step(granted, now_ms=60)
    assert [record.message.message_id for _, record in admitted] == ["m2"]
    assert changes == [StopChange("/queue/q", "")]
    assert waiting_room.stops() == {}


def test_a_send_still_waiting_after_its_send_timeout_is_refused_with_its_receipt() -> None:
    waiting_room, _, outbox = room()
    assert waiting_room.admit(0, send(1), now_ms=0)
    assert not waiting_room.admit(3, send(2), now_ms=0)
    waiting_room.step([], now_ms=99)
    assert outbox.take() == {}
    admitted, _ = waiting_room.step([], now_ms=100)
    assert admitted == []
    [refuse] = outbox.take()[3]
    assert isinstance(refuse, Refuse)
    assert refuse.message == (
        "ResourceAllocation: /queue/q quota small max_messages 1, max_bytes 1024 reached"
    )
    assert "waited send_timeout_ms 100" in refuse.detail and refuse.receipt == "r2"


def test_a_message_larger_than_the_quota_can_ever_hold_is_refused_at_once() -> None:
    waiting_room, _, outbox = room()
    assert not waiting_room.admit(0, send(1, body=b"x" * 1025), now_ms=0)
    [refuse] = outbox.take()[0]
    assert isinstance(refuse, Refuse)
    assert refuse.message == (
        "ResourceAllocation: /queue/q quota small max_messages 1, max_bytes 1024: "
        "a 1025-byte message can never fit"
    )
    assert waiting_room.step([], now_ms=1000) == ([], [])


def test_destinations_without_a_quota_always_go() -> None:
    waiting_room, _, outbox = room()
    for n in range(5):
        assert waiting_room.admit(0, send(n, "/topic/elsewhere"), now_ms=0)
    assert outbox.take() == {}
