"""The states of one STOMP connection on the server side, and every way between them.

Everything that changes a session's state goes through `transition`, and the table below is
the whole of it: an event the table does not list for the current state is a bug in the
caller (the gateway shell fed an event it should not have), raised as `SessionStateError`
naming both. h11's `_state.py` is the model.

    AWAITING_CONNECT --CONNECT--> CONNECTED --DISCONNECT--> CLOSING --CLOSED--> CLOSED
           |                         |                         ^
           |                         +--DISCONNECT_RECEIPTED--> DISCONNECTING
           |                         |                         |   (every pipeline answered:
           +--------ERROR------------+---------ERROR-----------+    RECEIPTS_ANSWERED -> CLOSING)

Any state but CLOSED goes to CLOSED when the socket closes (CLOSED).
"""

from __future__ import annotations

import enum
from typing import Final

__all__ = ["READING", "WRITING", "Event", "SessionState", "SessionStateError", "transition"]


class SessionState(enum.Enum):
    """Where a connection is in its life."""

    #: A new connection: only CONNECT (or STOMP) may come, within `stomp.connect_timeout_ms`.
    AWAITING_CONNECT = "awaiting-connect"
    #: CONNECTED was sent: every client frame is handled.
    CONNECTED = "connected"
    #: DISCONNECT asked for a receipt: nothing more is read; the RECEIPT is written once every
    #: pipeline the connection talked to has answered for the frames before it.
    DISCONNECTING = "disconnecting"
    #: An ERROR or the last RECEIPT is queued: the connection ends once the output is written.
    CLOSING = "closing"
    #: The socket is closed (by the peer, or by us after CLOSING): nothing more is written.
    CLOSED = "closed"

    # Members are singletons compared by identity, so identity hashes them: a session asks
    # `state in READING` for every frame, and Enum's own __hash__ is Python code.
    __hash__ = object.__hash__


class Event(enum.Enum):
    """What moves a session from one state to another."""

    CONNECT = "CONNECT accepted"
    DISCONNECT = "DISCONNECT without a receipt"
    DISCONNECT_RECEIPTED = "DISCONNECT with a receipt"
    RECEIPTS_ANSWERED = "every pipeline answered the DISCONNECT"
    ERROR = "ERROR sent"
    CLOSED = "socket closed"


_S, _E = SessionState, Event

TRANSITIONS: Final[dict[tuple[SessionState, Event], SessionState]] = {
    (_S.AWAITING_CONNECT, _E.CONNECT): _S.CONNECTED,
    (_S.AWAITING_CONNECT, _E.ERROR): _S.CLOSING,
    (_S.AWAITING_CONNECT, _E.CLOSED): _S.CLOSED,
    (_S.CONNECTED, _E.DISCONNECT): _S.CLOSING,
    (_S.CONNECTED, _E.DISCONNECT_RECEIPTED): _S.DISCONNECTING,
    (_S.CONNECTED, _E.ERROR): _S.CLOSING,
    (_S.CONNECTED, _E.CLOSED): _S.CLOSED,
    (_S.DISCONNECTING, _E.RECEIPTS_ANSWERED): _S.CLOSING,
    (_S.DISCONNECTING, _E.ERROR): _S.CLOSING,
    (_S.DISCONNECTING, _E.CLOSED): _S.CLOSED,
    (_S.CLOSING, _E.CLOSED): _S.CLOSED,
}

#: States in which client frames are read and handled.
READING: Final = frozenset({_S.AWAITING_CONNECT, _S.CONNECTED})
#: States in which frames are still written to the client (deliveries, receipts).
WRITING: Final = frozenset({_S.CONNECTED, _S.DISCONNECTING})


class SessionStateError(RuntimeError):
    """An event the current state does not allow: a bug in whoever fed it, not the client's
    mistake (that is an ERROR frame)."""

    def __init__(self, state: SessionState, event: Event | str) -> None:
        self.state = state
        self.event = event
        what = event.value if isinstance(event, Event) else event
        super().__init__(f"{what} is not allowed in state {state.value}")


def transition(state: SessionState, event: Event) -> SessionState:
    """The state `event` leads to from `state`; SessionStateError if it leads nowhere."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise SessionStateError(state, event) from None
