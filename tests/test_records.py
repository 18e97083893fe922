"""Ring records: every type survives encode/decode, and kinds are stable and distinct."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

import mpbroker.records as records
from mpbroker.records import (
    ACK_AUTO,
    ACK_CLIENT,
    ACK_INDIVIDUAL,
    ACK_MODES,
    KIND_OF,
    Ack,
    Barrier,
    BarrierDone,
    ConnClosed,
    Credit,
    Deliver,
    FlowState,
    Hello,
    Message,
    Nack,
    PipelineHello,
    Receipt,
    Record,
    Refuse,
    Registered,
    ReplayBatch,
    ReplayHello,
    ReplayRelease,
    ReplayRequest,
    Send,
    Subscribe,
    Unsubscribe,
    decode,
    encode,
)
from mpbroker.shm import MAX_KIND

MESSAGE = Message(
    "ID-1-0.0-7",
    "/queue/orders",
    {"content-type": "text/plain", "x": ""},
    b"\x00body\xff",
    1_700_000_000_000,
    persistent=True,
    priority=9,
    expires_ms=1_700_000_060_000,
    redelivered=True,
)

EVERY_RECORD: list[Record] = [
    Hello(2, 5),
    Send(1 << 40, MESSAGE, "receipt-1"),
    Send(3, Message("m", "/topic/t", {}, b"", 0)),
    Send(3, Message("m", "/topic/t", {}, b"(\xb5/\xfd\x00", 0, encoding="zstd")),
    Subscribe(4, 1, "sub-0", "/topic/t", ACK_INDIVIDUAL, 1000, "r"),
    Unsubscribe(4, 1, "r"),
    Ack(4, 1, "ID-1", "r"),
    Nack(4, 1, "ID-2"),
    Credit(4, [(1, 10), (2, 3)]),
    Credit(4, []),
    ConnClosed(9),
    Barrier(9, 12),
    Registered(1, 3),
    PipelineHello(0, 2),
    Deliver([(1, 2), (3, 4)], MESSAGE),
    Receipt(7, "r-7"),
    Refuse(7, "ResourceAllocation: x", "detail", "r"),
    Refuse(7, "short"),
    BarrierDone(7, 12, 1),
    ReplayRequest(1, "app/sub", 1 << 33, [0, 0, 0, 0, 10, 0, 0, 0, 0, 1 << 40], 99),
    ReplayRelease(1),
    ReplayRelease(1, "app/sub"),
    ReplayBatch("app/sub", 7, [MESSAGE], [3, 4], [12] * 10, True),
    ReplayHello(0, 1),
    FlowState(1, "vol_queue_store", "/queue/q", "msg_high 80000"),
    FlowState(1, "topics", "", ""),
]


@pytest.mark.parametrize("record", EVERY_RECORD, ids=lambda r: type(r).__name__)
def test_every_record_type_round_trips(record: Record) -> None:
    kind, payload = encode(record)
    assert isinstance(payload, bytes)
    decoded = decode(kind, payload)
    assert type(decoded) is type(record)
    assert decoded == record


# The ring kind of every record type, by hand: a change here is a change of the ring format.
KINDS = {
    Hello: 1,
    Send: 2,
    Subscribe: 3,
    Unsubscribe: 4,
    Ack: 5,
    Nack: 6,
    Credit: 7,
    ConnClosed: 8,
    Barrier: 9,
    PipelineHello: 10,
    Deliver: 11,
    Receipt: 12,
    Refuse: 13,
    BarrierDone: 14,
    Registered: 15,
    ReplayRequest: 16,
    ReplayRelease: 17,
    ReplayBatch: 18,
    ReplayHello: 19,
    FlowState: 20,
}


def test_every_record_type_has_its_own_fixed_kind() -> None:
    assert {type(r) for r in EVERY_RECORD} == set(KINDS)
    assert KIND_OF == KINDS
    assert {cls: cls.kind for cls in KINDS} == KINDS
    assert len(set(KINDS.values())) == len(KINDS)
    assert all(0 < kind <= MAX_KIND for kind in KINDS.values())


@pytest.mark.parametrize("kind", [0, 21, -1, 255])
def test_decode_of_an_unknown_kind_is_a_value_error(kind: int) -> None:
    with pytest.raises(ValueError, match=f"unknown record kind {kind}"):
        decode(kind, b"\x90")


def test_decode_of_a_payload_of_another_kind_is_refused() -> None:
    _, payload = encode(Hello(1, 2))
    with pytest.raises(msgspec.ValidationError):
        decode(KIND_OF[Send], payload)


def test_records_are_encoded_without_field_names() -> None:
    _, payload = encode(Receipt(1, "r"))
    assert b"receipt" not in payload
    assert len(payload) <= 4


def test_message_defaults() -> None:
    message = Message("m", "/queue/q", {}, b"", 0)
    assert (message.persistent, message.priority, message.expires_ms, message.redelivered) == (
        False,
        4,
        0,
        False,
    )


def test_a_message_written_before_its_last_fields_existed_still_decodes() -> None:
    # An array-like record: an older writer's Message is the same array without the last
    # fields (`encoding`, `temp_key`, then `kept_after`: a ring record or a replay batch
    # from a worker not yet upgraded).
    fields = msgspec.msgpack.decode(msgspec.msgpack.encode(MESSAGE))
    assert fields[-3:] == ["", 0, 0] and len(fields) == len(Message.__struct_fields__)
    for missing in (1, 2, 3):
        old = msgspec.msgpack.encode(fields[:-missing])
        decoded = msgspec.msgpack.decode(old, type=Message)
        assert decoded == MESSAGE
        assert (decoded.encoding, decoded.temp_key, decoded.kept_after) == ("", 0, 0)


def test_ack_modes_match_the_stomp_names() -> None:
    assert ACK_MODES == {
        "auto": ACK_AUTO,
        "client": ACK_CLIENT,
        "client-individual": ACK_INDIVIDUAL,
    }
    assert len(set(ACK_MODES.values())) == 3


def test_public_names() -> None:
    for name in records.__all__:
        assert hasattr(records, name)


INT64 = st.integers(-(2**63), 2**63 - 1)
TEXT = st.text(max_size=20)

messages = st.builds(
    Message,
    message_id=TEXT,
    destination=TEXT,
    headers=st.dictionaries(TEXT, TEXT, max_size=5),
    body=st.binary(max_size=200),
    timestamp_ms=INT64,
    persistent=st.booleans(),
    priority=st.integers(0, 9),
    expires_ms=INT64,
    redelivered=st.booleans(),
)


@given(message=messages, conn=st.integers(0, 2**64 - 1), receipt=TEXT)
def test_any_message_round_trips_inside_send_and_deliver(
    message: Message, conn: int, receipt: str
) -> None:
    for record in (Send(conn, message, receipt), Deliver([(conn, 1)], message)):
        kind, payload = encode(record)
        assert decode(kind, payload) == record
