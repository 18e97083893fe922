"""The public surface other modules are written against."""

from __future__ import annotations

import dataclasses

import pytest

import mpbroker.stomp as stomp
from mpbroker.native import compiled_modules
from mpbroker.stomp import CLIENT_COMMANDS, HEARTBEAT_BYTES, SERVER_COMMANDS, Frame, FrameLimits


def test_public_names() -> None:
    assert set(stomp.__all__) == {
        "BadHeaderEscape",
        "CLIENT_COMMANDS",
        "Frame",
        "FrameLimits",
        "FrameParser",
        "FrameTooLarge",
        "HEARTBEAT_BYTES",
        "HeaderTooLong",
        "MalformedFrame",
        "ProtocolError",
        "SERVER_COMMANDS",
        "SUPPORTED_VERSIONS",
        "TooManyHeaders",
        "UnknownCommand",
        "encode_frame",
        "escape_header_value",
        "frame_bytes",
        "negotiate_heartbeat",
        "negotiate_version",
        "parse_heartbeat",
        "plain_header_text",
        "unescape_header_value",
        # The opening handshake of STOMP over WebSocket (pure decisions).
        "BadOrigin",
        "HandshakeRefused",
        "MalformedRequest",
        "RequestTooLarge",
        "WEBSOCKET_PATHS",
        "WEBSOCKET_SUBPROTOCOLS",
        "WebSocketAccept",
        "accept_request",
        "parse_allowed_origins",
    }
    for name in stomp.__all__:
        assert getattr(stomp, name) is not None


def test_command_sets() -> None:
    client, server = CLIENT_COMMANDS, SERVER_COMMANDS
    assert client == {
        "CONNECT",
        "STOMP",
        "SEND",
        "SUBSCRIBE",
        "UNSUBSCRIBE",
        "ACK",
        "NACK",
        "BEGIN",
        "COMMIT",
        "ABORT",
        "DISCONNECT",
    }
    assert server == {"CONNECTED", "MESSAGE", "RECEIPT", "ERROR"}
    assert HEARTBEAT_BYTES == b"\n"


def test_frame_defaults_are_not_shared() -> None:
    first, second = Frame("SEND"), Frame("SEND")
    first.headers["a"] = "1"
    assert second.headers == {}
    assert first.body == b""


def test_frame_limit_defaults() -> None:
    limits = FrameLimits()
    assert (
        limits.max_frame_bytes,
        limits.max_headers,
        limits.max_header_bytes,
        limits.max_command_bytes,
    ) == (1 << 20, 1000, 10 * 1024, 1024)
    with pytest.raises(dataclasses.FrozenInstanceError):
        limits.max_headers = 5  # type: ignore[misc]


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(FrameLimits)])
@pytest.mark.parametrize("value", [0, -1, 1.5, "10"])
def test_frame_limits_must_be_positive_ints(field: str, value: object) -> None:
    if type(value) is not int and "mpbroker.stomp._frame" in compiled_modules():
        # Compiled, the class checks its arguments' types before __post_init__ runs.
        with pytest.raises(TypeError):
            FrameLimits(**{field: value})  # type: ignore[arg-type]
        return
    with pytest.raises(ValueError, match=f"FrameLimits.{field} must be a positive int"):
        FrameLimits(**{field: value})  # type: ignore[arg-type]
