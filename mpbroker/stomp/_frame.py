"""The frame value type, the limits the parser enforces, and protocol constants."""

from __future__ import annotations

from dataclasses import dataclass, field

#: Frames a client sends (what a broker's parser accepts).
CLIENT_COMMANDS: frozenset[str] = frozenset(
    {
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
)

#: Frames a server sends (what a client's parser accepts).
SERVER_COMMANDS: frozenset[str] = frozenset({"CONNECTED", "MESSAGE", "RECEIPT", "ERROR"})

#: Protocol versions this codec speaks, lowest first.
SUPPORTED_VERSIONS: tuple[str, ...] = ("1.0", "1.1", "1.2")

#: A heart-beat is a bare end-of-line between frames (STOMP 1.1+).
HEARTBEAT_BYTES = b"\n"

# The spec exempts these frames from header escaping in every version, so that a 1.0 peer
# can read them before a version has been negotiated.
UNESCAPED_COMMANDS: frozenset[str] = frozenset({"CONNECT", "STOMP", "CONNECTED"})


@dataclass(slots=True)
class Frame:
    """One STOMP frame.

    ``headers`` keeps insertion order, which is the order of the lines on the wire. When a
    parsed frame repeated a header, only the first value is kept (STOMP 1.2, "Repeated Header
    Entries"). ``body`` is raw bytes; its encoding is whatever ``content-type`` says.
    """

    command: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class FrameLimits:
    """Size limits the parser enforces on incoming frames, so a peer cannot exhaust memory.

    The spec lets a server limit "the number of frame headers allowed in a single frame, the
    maximum length of header lines, the maximum size of a frame body" and answer an ERROR.
    """

    # Whole frame: command, headers, body and the NUL. ActiveMQ's default maxFrameSize is
    # 100 MiB (MAX_DATA_LENGTH); RabbitMQ's STOMP plugin has max_frame_size 4 MiB; Artemis
    # leaves it unbounded. 1 MiB suits a broker whose messages travel over shared-memory rings.
    max_frame_bytes: int = 1 << 20
    # Header lines per frame: ActiveMQ StompWireFormat.MAX_HEADERS is 1000.
    max_headers: int = 1000
    # One header line in bytes: ActiveMQ StompWireFormat.MAX_HEADER_LENGTH is 10 KiB; h11 caps
    # a whole HTTP head at 16 KiB (DEFAULT_MAX_INCOMPLETE_EVENT_SIZE).
    max_header_bytes: int = 10 * 1024
    # The command line in bytes: ActiveMQ StompWireFormat.MAX_COMMAND_LENGTH is 1024. The
    # longest real command, UNSUBSCRIBE, is 11 bytes, so this only bounds garbage.
    max_command_bytes: int = 1024

    def __post_init__(self) -> None:
        for name in ("max_frame_bytes", "max_headers", "max_header_bytes", "max_command_bytes"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"FrameLimits.{name} must be a positive int, not {value!r}")
