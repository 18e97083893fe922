"""The exception types: hierarchy, fields, messages, pickling."""

from __future__ import annotations

import pickle

import pytest

from mpbroker.stomp import (
    BadHeaderEscape,
    FrameTooLarge,
    HeaderTooLong,
    MalformedFrame,
    ProtocolError,
    TooManyHeaders,
    UnknownCommand,
)

ERRORS: list[tuple[ProtocolError, str]] = [
    (
        FrameTooLarge(size=2000000, limit=1048576),
        "frame of 2000000 bytes exceeds max_frame_bytes 1048576",
    ),
    (
        FrameTooLarge(size=1048577, limit=1048576, at_least=True),
        "frame of at least 1048577 bytes exceeds max_frame_bytes 1048576",
    ),
    (TooManyHeaders(count=1001, limit=1000), "frame with 1001 headers exceeds max_headers 1000"),
    (
        HeaderTooLong(size=10241, limit=10240),
        "header line of 10241 bytes exceeds max_header_bytes 10240",
    ),
    (
        HeaderTooLong(size=10242, limit=10240, at_least=True),
        "header line of at least 10242 bytes exceeds max_header_bytes 10240",
    ),
    (UnknownCommand(command="FOO"), "unknown command 'FOO'"),
    (MalformedFrame(reason="no NUL"), "malformed frame: no NUL"),
    (BadHeaderEscape(sequence="\\t"), "undefined escape sequence '\\t' in a header (STOMP 1.2)"),
    (
        BadHeaderEscape(sequence="\\\r", version="1.1"),
        "undefined escape sequence '\\\\\\r' in a header (STOMP 1.1)",
    ),
    (ProtocolError("something else"), "something else"),
]


@pytest.mark.parametrize(("error", "message"), ERRORS, ids=[type(e).__name__ for e, _ in ERRORS])
def test_message_and_pickling(error: ProtocolError, message: str) -> None:
    assert isinstance(error, ProtocolError)
    assert str(error) == message
    # Messages go into ERROR frames' message headers: one line, whatever the peer sent.
    assert "\n" not in message and "\r" not in message
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == message
    assert vars(copy) == vars(error)


def test_wire_values_are_shortened_in_messages() -> None:
    error = UnknownCommand("Z" * 10_000)
    assert error.command == "Z" * 10_000
    assert str(error) == f"unknown command {'Z' * 64!r}..."


def test_control_characters_in_wire_values_are_shown_escaped() -> None:
    assert str(UnknownCommand("A\r\nB")) == "unknown command 'A\\r\\nB'"
