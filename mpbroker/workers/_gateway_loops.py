"""The gateway's hottest loops: client frames into the session, its records into the
pipelines' rings, Deliver records out as MESSAGE frames.

Every frame a client sends passes through `receive_run` and `post_run`, and every message
a gateway delivers through `deliver_run`. They live apart from the gateway's trio shell so
that mypyc compiles them with the session and rings they call
(`mpbroker.native.HOT_MODULES`). Each handles the common case and stops where the shell
must take over (a frame that may have to wait or be authenticated, a ring without room, a
record of another kind); the shell handles that one in its place and calls again, so the
order never changes.
"""

from __future__ import annotations

from collections.abc import Sized
from typing import Final, Protocol, TypeVar

import msgspec

from mpbroker.records import Deliver, Message, Record, encode_payload
from mpbroker.session import Admission, GatewaySession, Pacer, SessionState, flow_controlled
from mpbroker.shm import RingWriter
from mpbroker.stomp import Frame

__all__ = [
    "DELIVER_KIND",
    "RUN_DENIED",
    "RUN_DONE",
    "RUN_REFUSED",
    "RUN_SHELL",
    "Frames",
    "HasRing",
    "HasSession",
    "deliver_run",
    "post_run",
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
    """What `deliver_run` needs of a gateway's connection: its session."""

    @property
    def session(self) -> GatewaySession: ...


class HasRing(Protocol):
    """What `post_run` needs of a gateway's port to a pipeline: its ring writer, the
    records waiting for room in it, and whether records are staged and not published."""

    writer: RingWriter
    dirty: bool

    @property
    def backlog(self) -> Sized: ...


_Conn = TypeVar("_Conn", bound=HasSession)
_Port = TypeVar("_Port", bound=HasRing)


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


def post_run(routes: list[tuple[int, Record]], start: int, ports: list[_Port]) -> tuple[int, bytes]:
    """Stage the records of `routes` from `start` on into their pipelines' rings, while the
    port has nothing waiting and its ring has room. Returns the index of the first record
    the shell must post itself (it queues it behind the others, or waits for room), with
    its payload (b"" when it was not encoded); the count and b"" when all are staged. A
    payload a full ring took in part must be continued as the same object (RingWriter.stage),
    so the shell posts that one. The ports are left to publish."""
    end = len(routes)
    i = start
    while i < end:
        pipeline, record = routes[i]
        port = ports[pipeline]
        if len(port.backlog):
            return i, b""
        payload = encode_payload(record)
        if not port.writer.stage(record.kind, payload):
            return i, payload
        port.dirty = True
        i += 1
    return end, b""
