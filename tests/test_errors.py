"""The refusals build their own text: what the ERROR frame's message header says."""

from __future__ import annotations

from mpbroker.errors import LimitReached, MessageTooLarge, NeverFits, Refusal
from mpbroker.records import Refuse


def test_limit_reached_names_where_the_limit_and_its_value() -> None:
    error = LimitReached("/queue/orders", "msg_high", 5000, "drain it")
    assert error.message == "ResourceAllocation: /queue/orders msg_high 5000 reached"
    assert (error.where, error.limit, error.value, error.detail) == (
        "/queue/orders",
        "msg_high",
        5000,
        "drain it",
    )
    assert str(error) == error.message
    assert isinstance(error, Refusal)


def test_limit_reached_takes_a_limit_that_already_says_its_value() -> None:
    error = LimitReached("/queue/q", "quota default max_messages 1")
    assert error.message == "ResourceAllocation: /queue/q quota default max_messages 1 reached"
    assert error.detail == ""


def test_never_fits_names_the_size() -> None:
    error = NeverFits("/queue/q", "quota small max_bytes 10", 11)
    assert error.message == (
        "ResourceAllocation: /queue/q quota small max_bytes 10: a 11-byte message can never fit"
    )


def test_message_too_large_says_what_to_change() -> None:
    error = MessageTooLarge(101, 100)
    assert error.message == "message body of 101 bytes exceeds max_message_bytes 100"
    assert "[memory] max_message_bytes" in error.detail


def test_a_refuse_record_carries_a_refusal() -> None:
    error = LimitReached("transactions", "max_open_per_connection", 2)
    assert Refuse.of(7, error, "r1") == Refuse(7, error.message, error.detail, "r1")
