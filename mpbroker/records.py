"""Records passed between workers through the shared-memory rings.

A ring record is `[length][kind][payload]`; `kind` says which record type the payload is
and the payload is that type encoded with msgspec's msgpack (array-like structs: no field
names on the wire, so a record costs little more than its strings and body).

Gateway -> pipeline: Hello, Send, Subscribe, Unsubscribe, Ack, Nack, Credit, ConnClosed,
Barrier, Registered. Pipeline -> gateway: PipelineHello, Deliver, Receipt, Refuse, BarrierDone.

Identifiers: `gateway` and `pipeline` are worker indexes; `conn` is a connection id unique
within a gateway across its restarts (the incarnation is in its high bits); `sub` is the
gateway's handle for one subscription of one connection.
"""

from __future__ import annotations

import typing
from typing import Any, ClassVar, Final

import msgspec

from mpbroker.errors import Refusal

__all__ = [
    "ACK_AUTO",
    "ACK_CLIENT",
    "ACK_INDIVIDUAL",
    "ACK_MODES",
    "CONN_INCARNATION_SHIFT",
    "KIND_OF",
    "NO_HEADERS",
    "Ack",
    "Barrier",
    "BarrierDone",
    "ConnClosed",
    "Credit",
    "Deliver",
    "FlowState",
    "Hello",
    "Message",
    "Nack",
    "PipelineHello",
    "Receipt",
    "Record",
    "Refuse",
    "Registered",
    "ReplayBatch",
    "ReplayHello",
    "ReplayRelease",
    "ReplayRequest",
    "Send",
    "Subscribe",
    "Unsubscribe",
    "conn_incarnation",
    "decode",
    "decode_page",
    "encode",
    "encode_page",
    "encode_payload",
    "message_size",
]

ACK_AUTO: Final = 0
ACK_CLIENT: Final = 1  # cumulative
ACK_INDIVIDUAL: Final = 2  # client-individual
ACK_MODES: Final = {"auto": ACK_AUTO, "client": ACK_CLIENT, "client-individual": ACK_INDIVIDUAL}

CONN_INCARNATION_SHIFT: Final = 40
"""A connection id is the incarnation of the gateway that made it, shifted this far, plus
its number in that incarnation."""


def conn_incarnation(conn: int) -> int:
    """The incarnation of the gateway whose connection `conn` is."""
    return conn >> CONN_INCARNATION_SHIFT


class Message(msgspec.Struct, array_like=True, gc=False):
    """One message as the broker keeps it. `headers` are the sender's own headers."""

    message_id: str
    destination: str
    headers: dict[str, str]
    body: bytes
    timestamp_ms: int
    persistent: bool = False
    priority: int = 4
    expires_ms: int = 0
    redelivered: bool = False
    # message_size(), set once by the owning pipeline so limits need not recompute it.
    size: int = 0
    # Persistent messages: the store's reference (0 = not stored) and earlier deliveries.
    seq: int = 0
    deliveries: int = 0
    # A stored message waiting in a queue with only its index entry in memory (headers and
    # body left in the store; see engine.IndexCache).
    paged: bool = False
    # The codec `body` is compressed with ("zstd", "zlib"; see mpbroker.compression), or ""
    # for a body kept as sent. Last: an array-like record written before it still decodes.
    encoding: str = ""
    # A non-persistent message paged out to the temp store (headers and body; see
    # encode_page): the key to read them back (0 = in memory).
    temp_key: int = 0
    # A non-persistent message published to a topic with durable subscriptions: the store
    # seq of the last persistent message stored before it there, so that a subscriber that
    # was away gets it in its place among the replayed persistent ones.
    kept_after: int = 0


# A paged message's page: its headers and body, to disk and back.
_page_encoder = msgspec.msgpack.Encoder()
_page_decoder = msgspec.msgpack.Decoder(tuple[dict[str, str], bytes])

# The headers of every paged message waiting in memory: one shared empty dict (never
# changed: a message's headers are replaced, not edited).
NO_HEADERS: Final[dict[str, str]] = {}


def encode_page(message: Message) -> bytes:
    """What paging a message out writes: its headers and body."""
    return _page_encoder.encode((message.headers, message.body))


def decode_page(page: bytes) -> tuple[dict[str, str], bytes]:
    """The headers and body `encode_page` wrote."""
    return _page_decoder.decode(page)


def message_size(message: Message) -> int:
    """Bytes a message is charged for in limits: body plus header text. A compressed body
    counts as stored (compressed): limits and quotas count the bytes the broker keeps."""
    size = len(message.body)
    for name, value in message.headers.items():  # (faster than summing two maps)
        size += len(name) + len(value)
    return size


class Hello(msgspec.Struct, array_like=True, gc=False):
    """A gateway (re)started: forget its old connections, it will re-register."""

    kind: ClassVar[int] = 1
    gateway: int
    incarnation: int


class Send(msgspec.Struct, array_like=True, gc=False):
    kind: ClassVar[int] = 2
    conn: int
    message: Message
    receipt: str = ""


class Subscribe(msgspec.Struct, array_like=True, gc=False):
    kind: ClassVar[int] = 3
    conn: int
    sub: int
    sub_id: str
    destination: str
    ack_mode: int
    prefetch: int
    receipt: str = ""
    # Durable topic subscription: "<client-id>/<name>"; "" for an ordinary subscription.
    durable: str = ""
    # JMS message selector (docs/selectors.md), checked by the gateway; "" selects all.
    selector: str = ""
    # Who subscribes (the authenticated user; "" without a users file): a durable
    # subscription belongs to the user who created it.
    user: str = ""


class Unsubscribe(msgspec.Struct, array_like=True, gc=False):
    kind: ClassVar[int] = 4
    conn: int
    sub: int
    receipt: str = ""
    # True: a durable subscription is removed with its backlog, not just left inactive.
    remove_durable: bool = False


class Ack(msgspec.Struct, array_like=True, gc=False):
    kind: ClassVar[int] = 5
    conn: int
    sub: int
    message_id: str
    receipt: str = ""


class Nack(msgspec.Struct, array_like=True, gc=False):
    kind: ClassVar[int] = 6
    conn: int
    sub: int
    message_id: str
    receipt: str = ""
    # False (RabbitMQ's `requeue:false`): not back to the queue but to its dead-letter queue.
    requeue: bool = True


class Credit(msgspec.Struct, array_like=True, gc=False):
    """Auto-ack deliveries the gateway has written to the socket: (sub, count) pairs."""

    kind: ClassVar[int] = 7
    conn: int
    subs: list[tuple[int, int]]


class ConnClosed(msgspec.Struct, array_like=True, gc=False):
    kind: ClassVar[int] = 8
    conn: int


class Barrier(msgspec.Struct, array_like=True, gc=False):
    """Answered with BarrierDone once every earlier record of the connection was handled."""

    kind: ClassVar[int] = 9
    conn: int
    token: int


class Registered(msgspec.Struct, array_like=True, gc=False):
    """Answer to PipelineHello: the gateway has re-sent every subscription it holds there."""

    kind: ClassVar[int] = 15
    gateway: int
    pipeline_incarnation: int


class PipelineHello(msgspec.Struct, array_like=True, gc=False):
    """A pipeline (re)started: send me the subscriptions you hold on my destinations."""

    kind: ClassVar[int] = 10
    pipeline: int
    incarnation: int


class Deliver(msgspec.Struct, array_like=True, gc=False):
    """Deliver one message to one or more subscriptions held by the receiving gateway."""

    kind: ClassVar[int] = 11
    targets: list[tuple[int, int]]  # (conn, sub)
    message: Message


class Receipt(msgspec.Struct, array_like=True, gc=False):
    kind: ClassVar[int] = 12
    conn: int
    receipt: str


class Refuse(msgspec.Struct, array_like=True, gc=False):
    """The pipeline refused a frame: the gateway sends ERROR and closes the connection."""

    kind: ClassVar[int] = 13
    conn: int
    message: str
    detail: str = ""
    receipt: str = ""

    @classmethod
    def of(cls, conn: int, refusal: Refusal, receipt: str = "") -> Refuse:
        """The record that carries `refusal` to the connection's gateway."""
        return cls(conn, refusal.message, refusal.detail, receipt)


class BarrierDone(msgspec.Struct, array_like=True, gc=False):
    kind: ClassVar[int] = 14
    conn: int
    token: int
    pipeline: int


class ReplayRequest(msgspec.Struct, array_like=True, gc=False):
    """pubsub -> replay: the next batch of a durable subscription's stored backlog.

    A request from the same partition for the same subscription replaces an earlier one;
    the subscription holds one of the replay worker's `max_concurrent` places from its
    first request until `ReplayRelease`.
    """

    kind: ClassVar[int] = 16
    partition: int  # pubsub pipeline index (its store is pubsub-<partition>)
    name: str  # durable subscription name
    request_id: int  # echoed in the batch; the owner ignores batches it no longer waits for
    # Per JMS priority 0-9: the replay continues after this seq (highest priority first).
    after: list[int]
    # Messages below this seq may have been delivered before the owner restarted.
    redeliver_below: int = 0


class ReplayRelease(msgspec.Struct, array_like=True, gc=False):
    """pubsub -> replay: a subscription is done replaying (caught up, or gone); an empty
    name releases every subscription of the partition (the owner restarted)."""

    kind: ClassVar[int] = 17
    partition: int
    name: str = ""


class ReplayBatch(msgspec.Struct, array_like=True, gc=False):
    """replay -> pubsub: stored messages of one subscription, in seq order."""

    kind: ClassVar[int] = 18
    name: str
    request_id: int
    messages: list[Message]
    expired: list[int]  # seqs found expired (not in messages): the owner settles them
    # Per priority: every stored message of the subscription up to this seq was looked at.
    scanned_upto: list[int]
    more: bool  # the batch stopped at a limit


class ReplayHello(msgspec.Struct, array_like=True, gc=False):
    """replay -> pubsub: a replay worker (re)started; ask again for what you wait for."""

    kind: ClassVar[int] = 19
    worker: int
    incarnation: int


class FlowState(msgspec.Struct, array_like=True, gc=False):
    """pipeline -> gateways: producers to a destination must stop (`reason` names the limit,
    e.g. "msg_high 80000") or may go again (`reason` ""). An empty destination stands for
    every destination of that store in the pipeline (a global limit)."""

    kind: ClassVar[int] = 20
    pipeline: int
    store: str  # the config section of the limit: vol_queue_store, pers_queue_store, ...
    destination: str
    reason: str


Record = (
    Hello
    | Send
    | Subscribe
    | Unsubscribe
    | Ack
    | Nack
    | Credit
    | ConnClosed
    | Barrier
    | Registered
    | PipelineHello
    | Deliver
    | Receipt
    | Refuse
    | BarrierDone
    | ReplayRequest
    | ReplayRelease
    | ReplayBatch
    | ReplayHello
    | FlowState
)

# Ring kind numbers: each record type's `kind`, given by hand where the type is declared, so
# adding a type never renumbers another (a gateway and a pipeline of one broker always run
# the same code, but a number is a promise nobody should have to check by counting). 0 is
# reserved by the ring itself. tests/test_records.py pins the table.
_TYPES: Final[tuple[type[Any], ...]] = typing.get_args(Record)
KIND_OF: Final[dict[type[Any], int]] = {cls: cls.kind for cls in _TYPES}
_DECODERS: Final[dict[int, msgspec.msgpack.Decoder[Any]]] = {
    cls.kind: msgspec.msgpack.Decoder(cls) for cls in _TYPES
}
#: A record's payload (its ring kind is `record.kind`): msgspec's encoder itself, which the
#: compiled hot loops call without the Python frame of `encode`.
encode_payload: Final = msgspec.msgpack.Encoder().encode


def encode(record: Record) -> tuple[int, bytes]:
    """(ring kind, payload) for a record."""
    return record.kind, encode_payload(record)


def decode(kind: int, payload: bytes) -> Record:
    """The record a ring kind and payload stand for; ValueError for an unknown kind."""
    try:
        decoder = _DECODERS[kind]
    except KeyError:
        raise ValueError(f"unknown record kind {kind}") from None
    result: Record = decoder.decode(payload)
    return result
