"""The gateway's two hottest loops: client frames into the session, Deliver records out.

Every frame a client sends passes through `receive_run` and every message a gateway
delivers through `deliver_run`. They live apart from the gateway's trio shell so that
mypyc compiles them with the session they call (`mpbroker.native.HOT_MODULES`). Each
handles the common case and stops where the shell must take over (a frame that may have to
wait or be authenticated, a record of another kind); the shell handles that one in its
place and calls again, so the order never changes.
"""

from __future__ import annotations

from typing import Final, Protocol, TypeVar

import msgspec

from mpbroker.records import Deliver, Message
from mpbroker.session import Admission, GatewaySession, Pacer, SessionState, flow_controlled
from mpbroker.stomp import Frame

__all__ = [
    "DELIVER_KIND",
    "RUN_DENIED",
    "RUN_DONE",
    "RUN_REFUSED",
    "RUN_SHELL",
    "Frames",
    "HasSession",
    "deliver_run",
    "receive_run",
]

# Why receive_run stopped, with the index it returns:
RUN_DONE: Final = 0  # every frame was handled (the index is their count)
RUN_SHELL: Final = 1  # the frame at the index needs the shell (it may wait, or connects)
RUN_REFUSED: Final = 2  # the SEND at the index was refused (its ERROR is said): read no more
RUN_DENIED: Final = 3  # the frame before the index was denied (its ERROR is said): log it

_CONNECTED: Final = SessionState.CONNECTED

DELIVER_KIND: Final = Deliver.kind
# Deliver records only: records.decode is the general way, but a call through it costs an
# interpreted frame per message (this loop's module is compiled; records' is not).
_decode_deliver: Final = msgspec.msgpack.Decoder(Deliver).decode

# The MESSAGE frames of one batch's messages, per message id: the message they were made of
# and its frame per protocol version, so that a message delivered in several records (a
# topic's subscribers drained one by one) is encoded once.
Frames = dict[str, tuple[Message, dict[str, bytes]]]


class HasSession(Protocol):
    """What the loop needs of a gateway's connection: its session."""

    @property
    def session(self) -> GatewaySession: ...


_Conn = TypeVar("_Conn", bound=HasSession)


def deliver_run(
    batch: list[tuple[int, bytes]],
    start: int,
    connections: dict[int, _Conn],
    frames: Frames,
    touched: set[_Conn],
) -> int:
    """Apply the Deliver records of `batch` from `start` on, up to the first record of
    another kind; its index (`len(batch)` when none is left). The connections that got
    bytes to write join `touched`; deliveries to connections gone are dropped (their
    pipelines hear of the close and take the messages back)."""
    end = len(batch)
    i = start
    while i < end:
        kind, payload = batch[i]
        if kind != DELIVER_KIND:
            return i
        record: Deliver = _decode_deliver(payload)
        message = record.message
        seen = frames.get(message.message_id)
        if seen is None:
            shared: dict[str, bytes] = {}
            frames[message.message_id] = (message, shared)
        elif _same_frame(seen[0], message):
            shared = seen[1]
        else:
            shared = {}  # the id of another message (ids repeat across broker runs)
        for conn_id, sub in record.targets:
            conn = connections.get(conn_id)
            if conn is not None and conn.session.deliver(sub, message, shared):
                touched.add(conn)
        i += 1
    return end


def receive_run(
    session: GatewaySession,
    frames: list[Frame],
    start: int,
    now_ms: int,
    admission: Admission,
    memory_level: int,
    pacer: Pacer,
) -> tuple[int, int]:
    """Hand the session the frames of `frames` from `start` on that need nothing of the
    shell: those of a connected session that flow control lets go at once. (index, why it
    stopped: RUN_DONE, RUN_SHELL, RUN_REFUSED or RUN_DENIED)."""
    end = len(frames)
    i = start
    while i < end:
        if session.state is not _CONNECTED:
            return i, RUN_SHELL  # connecting, or no longer reading: the shell decides
        frame = frames[i]
        if flow_controlled(_CONNECTED, frame):
            # Before flow control may hold it (see GatewaySession.refuses_send).
            if session.refuses_send(frame):
                return i, RUN_REFUSED
            if not admission.admits_at_once(frame, memory_level, pacer):
                return i, RUN_SHELL
        session.frame_received(frame, now_ms)
        i += 1
        if session.denial:
            return i, RUN_DENIED
    return end, RUN_DONE


def _same_frame(first: Message, second: Message) -> bool:
    """Whether two deliveries of one id make the same MESSAGE frame. Ids repeat across
    broker runs when the supervisor's pid does, so a stored message may share its id with
    a new one (the store seq and timestamp tell them apart), and a redelivered copy
    differs in its redelivery headers."""
    return (
        first.seq == second.seq
        and first.timestamp_ms == second.timestamp_ms
        and first.deliveries == second.deliveries
        and first.redelivered == second.redelivered
        and first.destination == second.destination
    )
