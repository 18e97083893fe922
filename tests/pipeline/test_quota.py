"""The quota waiting room: SENDs wait for room in their quota, in order, within their send
timeout; one that can never fit is refused at once."""

from __future__ import annotations

from mpbroker.config import config_from_mapping
from mpbroker.engine import Outbox
from mpbroker.flow import QuotaBook
from mpbroker.pipeline import QuotaWaitingRoom, StopChange
from mpbroker.records import Barrier, Refuse, Send
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


def test_a_barrier_waits_for_the_sends_of_its_connection_that_wait() -> None:
    """A COMMIT's RECEIPT must not overtake its messages: its Barrier waits until they
    are let in (or refused), then comes after them."""
    waiting_room, quotas, _ = room()
    assert waiting_room.admit(0, send(1), now_ms=0)
    assert not waiting_room.admit(0, send(2), now_ms=0)  # connection 1 waits
    assert not waiting_room.holds_barrier(0, Barrier(2, 7))  # another connection: goes
    assert not waiting_room.holds_barrier(1, Barrier(1, 7))  # another gateway: goes
    assert waiting_room.holds_barrier(0, Barrier(1, 8))
    assert not waiting_room.admit(0, send(3), now_ms=0)  # after the barrier: holds it not
    assert waiting_room.step([], now_ms=10)[0] == []
    granted = quotas.release("/queue/q", 1, send(1).message.size)
    admitted, _ = waiting_room.step(granted, now_ms=20)
    assert [type(r).__name__ for _, r in admitted] == ["Send", "Barrier"]
    assert admitted[1] == (0, Barrier(1, 8))


def test_a_barrier_waiting_for_a_send_that_times_out_follows_its_refusal() -> None:
    waiting_room, _, outbox = room()
    assert waiting_room.admit(0, send(1), now_ms=0)
    assert not waiting_room.admit(0, send(2), now_ms=0)
    assert waiting_room.holds_barrier(0, Barrier(1, 8))
    admitted, _ = waiting_room.step([], now_ms=100)
    [refuse] = outbox.take()[0]
    assert isinstance(refuse, Refuse) and refuse.receipt == "r2"
    assert admitted == [(0, Barrier(1, 8))]
