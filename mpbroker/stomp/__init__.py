"""The sans-IO STOMP codec: bytes in, frames out, and frames back to bytes.

Nothing here touches a socket, a clock or trio; the gateway is a thin adapter that feeds a
:class:`FrameParser` what it reads and writes what :func:`encode_frame` returns. Supports
STOMP 1.0, 1.1 and 1.2 (https://stomp.github.io/stomp-specification-1.2.html).
`accept_request` judges the opening handshake of STOMP over WebSocket the same way.
"""

from ._encoder import encode_frame, frame_bytes, plain_header_text
from ._errors import (
    BadHeaderEscape,
    FrameTooLarge,
    HeaderTooLong,
    MalformedFrame,
    ProtocolError,
    TooManyHeaders,
    UnknownCommand,
)
from ._escape import escape_header_value, unescape_header_value
from ._frame import (
    CLIENT_COMMANDS,
    HEARTBEAT_BYTES,
    SERVER_COMMANDS,
    SUPPORTED_VERSIONS,
    Frame,
    FrameLimits,
)
from ._negotiate import negotiate_heartbeat, negotiate_version, parse_heartbeat
from ._parser import FrameParser
from ._websocket import (
    WEBSOCKET_PATHS,
    WEBSOCKET_SUBPROTOCOLS,
    BadOrigin,
    HandshakeRefused,
    MalformedRequest,
    RequestTooLarge,
    WebSocketAccept,
    accept_request,
    parse_allowed_origins,
)

__all__ = [
    "CLIENT_COMMANDS",
    "HEARTBEAT_BYTES",
    "SERVER_COMMANDS",
    "SUPPORTED_VERSIONS",
    "WEBSOCKET_PATHS",
    "WEBSOCKET_SUBPROTOCOLS",
    "BadHeaderEscape",
    "BadOrigin",
    "Frame",
    "FrameLimits",
    "FrameParser",
    "FrameTooLarge",
    "HandshakeRefused",
    "HeaderTooLong",
    "MalformedFrame",
    "MalformedRequest",
    "ProtocolError",
    "RequestTooLarge",
    "TooManyHeaders",
    "UnknownCommand",
    "WebSocketAccept",
    "accept_request",
    "encode_frame",
    "escape_header_value",
    "frame_bytes",
    "negotiate_heartbeat",
    "negotiate_version",
    "parse_allowed_origins",
    "parse_heartbeat",
    "plain_header_text",
    "unescape_header_value",
]
