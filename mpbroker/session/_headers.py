"""Which STOMP headers the broker reads on each frame, and what it does with the others.

Clients arrive from ActiveMQ, Artemis and RabbitMQ with the headers those brokers honour,
and a header the broker neither acts on nor refuses would silently change what the client
gets (a "browse" that consumes, a message group spread over every consumer, a delayed
message delivered at once). So every header is one of:

* **honoured**: the broker acts on it (some only for the values the note names);
* **carried** (SEND): it travels with the message as a property, for consumers and
  selectors, as any header the broker does not read;
* **dropped** (SEND): the broker's own MESSAGE header; a producer's copy is removed, so a
  consumer can trust it (forwarding a received MESSAGE's headers is common);
* **ignored**: harmless here, ignored on purpose (the note says why); logged once per
  connection;
* **refused**: not supported (yet): an ERROR naming the header, and nothing of the frame
  takes effect. A refused header with a `default` value is accepted when it asks for that
  value, which is what the broker does anyway (``activemq.exclusive:false``).

A rule marked `boolean` reads its value with `boolean`, one rule for every such header:
``true`` or ``false`` in any case (stomp.py writes Python's ``True`` as ``True``), spaces
around ignored; anything else is refused, never taken for ``false``.

The broker vendors' header families -- ``activemq.*``, ``JMSX*``, ``AMQ_*``, ``_AMQ_*`` and
RabbitMQ's ``x-*`` -- are refused by name unless a rule below says otherwise: a header of
theirs the broker does not know may change what a client expects, so it is never ignored.
On SEND an ``x-`` header that RabbitMQ does not read is an ordinary application header
(RabbitMQ passes those on too) and is carried. Outside the families, a header a SEND does not
name is carried (it is a message property), and one another frame does not name is ignored
and logged once per connection (STOMP lets clients add headers).

`RULES` is the one table: the session asks `rule_for`, and docs/headers.md shows
`markdown_table()` (a test keeps the two the same). Pure data, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "DROPPED_FROM_SEND",
    "FAMILIES",
    "FRAMES",
    "HONOURED",
    "RULES",
    "SEND_ATTENTION",
    "HeaderRule",
    "Treatment",
    "boolean",
    "markdown_table",
    "rule_for",
]

Treatment = Literal["honoured", "carried", "dropped", "ignored", "refused"]

#: The client frames, in the order the table shows them.
FRAMES: Final = (
    "CONNECT",
    "SEND",
    "SUBSCRIBE",
    "UNSUBSCRIBE",
    "ACK",
    "NACK",
    "BEGIN",
    "COMMIT",
    "ABORT",
    "DISCONNECT",
)

#: The vendors' header families: a header of one of them that no rule names is refused
#: (on SEND, ``x-`` ones are carried: see the module doc).
FAMILIES: Final = ("activemq.", "JMSX", "AMQ_", "_AMQ_", "x-")

_EVERY_FRAME: Final = FRAMES
_AFTER_CONNECT: Final = FRAMES[1:]
_DURABLE_FRAMES: Final = ("SUBSCRIBE", "UNSUBSCRIBE")


@dataclass(frozen=True, slots=True)
class HeaderRule:
    """What the broker does with one header (or, ending in ``*``, a family of headers) on
    the `frames` it names. `source` is who defined it; `note` says what the broker does
    with it, or why it is refused or harmless; `default` is the one value a refused header
    may carry (it asks for what the broker does anyway); `boolean`: its value is read by
    `boolean` (anything but true or false is refused)."""

    header: str
    frames: tuple[str, ...]
    treatment: Treatment
    source: str
    note: str
    default: str | None = None
    boolean: bool = False

    @property
    def family(self) -> bool:
        """Whether this rule is a family's catch-all (``AMQ_*``)."""
        return self.header.endswith("*")


def _rule(
    header: str,
    frames: str | tuple[str, ...],
    treatment: Treatment,
    source: str,
    note: str,
    default: str | None = None,
    *,
    boolean: bool = False,
) -> HeaderRule:
    return HeaderRule(
        header,
        (frames,) if isinstance(frames, str) else frames,
        treatment,
        source,
        note,
        default,
        boolean,
    )


def boolean(value: str) -> bool | None:
    """A boolean header's value: ``true`` or ``false`` in any case, spaces around ignored
    (stomp.py writes a Python ``True`` as ``True``); None for anything else, which the
    session refuses rather than take for false."""
    text = value.strip().lower()
    if text == "true":
        return True
    if text == "false":
        return False
    return None


_NOT_YET = "not supported yet"
_FAMILY_NOTE = "a header of this family that mpbroker does not read: refused, not ignored"

RULES: Final[tuple[HeaderRule, ...]] = (
    # -- every frame ---------------------------------------------------------------------
    _rule("content-length", _EVERY_FRAME, "honoured", "STOMP", "the body's length"),
    _rule("receipt", _AFTER_CONNECT, "honoured", "STOMP", "a RECEIPT once the frame is done"),
    # -- CONNECT (and STOMP) -------------------------------------------------------------
    _rule("accept-version", "CONNECT", "honoured", "STOMP", "1.0, 1.1 and 1.2"),
    _rule(
        "host",
        "CONNECT",
        "honoured",
        "STOMP",
        "any value: the broker has one virtual host (RabbitMQ reads it as the vhost)",
    ),
    _rule("login", "CONNECT", "honoured", "STOMP", "the user ([security.md](security.md))"),
    _rule("passcode", "CONNECT", "honoured", "STOMP", "the user's password"),
    _rule("heart-beat", "CONNECT", "honoured", "STOMP", "negotiated against `stomp.heartbeat_*`"),
    _rule(
        "client-id",
        "CONNECT",
        "honoured",
        "ActiveMQ, Artemis",
        "names the connection's durable subscriptions",
    ),
    _rule(
        "request-id",
        "CONNECT",
        "honoured",
        "ActiveMQ",
        "echoed as `response-id` in CONNECTED",
    ),
    # -- SEND ----------------------------------------------------------------------------
    _rule("destination", "SEND", "honoured", "STOMP", "`/queue/NAME` or `/topic/NAME`"),
    _rule(
        "transaction",
        ("SEND", "ACK", "NACK", "BEGIN", "COMMIT", "ABORT"),
        "honoured",
        "STOMP",
        "the open transaction the frame belongs to",
    ),
    _rule("content-type", "SEND", "carried", "STOMP", "the body's MIME type"),
    _rule(
        "persistent",
        "SEND",
        "honoured",
        "ActiveMQ, RabbitMQ",
        "`true`: stored before its RECEIPT ([persistence.md](persistence.md))",
        boolean=True,
    ),
    _rule("priority", "SEND", "honoured", "JMS", "0-9, higher first (default 4)"),
    _rule("expires", "SEND", "honoured", "ActiveMQ", "expiry time, epoch ms (0: never)"),
    _rule("ttl", "SEND", "honoured", "mpbroker", "time to live, ms from now"),
    _rule(
        "expiration",
        "SEND",
        "honoured",
        "RabbitMQ",
        "time to live, ms from now (as `ttl`); carried too",
    ),
    _rule("correlation-id", "SEND", "carried", "JMS", "JMSCorrelationID (selectors read it)"),
    _rule("type", "SEND", "carried", "JMS", "JMSType (selectors read it)"),
    _rule(
        "reply-to",
        "SEND",
        "carried",
        "JMS",
        "JMSReplyTo; a `/temp-queue/`, `/temp-topic/` or `/reply-queue/` one is refused: "
        "temporary destinations are " + _NOT_YET,
    ),
    _rule(
        "user-id",
        "SEND",
        "honoured",
        "RabbitMQ",
        "must be the connection's login (RabbitMQ's validated user id), else refused; carried",
    ),
    _rule("amqp-message-id", "SEND", "carried", "RabbitMQ", "the AMQP message id"),
    _rule("app-id", "SEND", "carried", "RabbitMQ", "the AMQP app id"),
    _rule("content-encoding", "SEND", "carried", "RabbitMQ", "the AMQP content encoding"),
    _rule("timestamp", "SEND", "carried", "RabbitMQ", "the producer's time"),
    _rule(
        "amq-msg-type",
        "SEND",
        "carried",
        "ActiveMQ",
        "text or bytes for JMS clients; every STOMP body is bytes here",
    ),
    _rule(
        "destination-type",
        "SEND",
        "honoured",
        "Artemis",
        "`ANYCAST` on a queue, `MULTICAST` on a topic; anything else is refused",
    ),
    _rule("message-id", "SEND", "dropped", "STOMP", "the broker's own, on MESSAGE"),
    _rule("subscription", "SEND", "dropped", "STOMP", "the broker's own, on MESSAGE"),
    _rule("ack", "SEND", "dropped", "STOMP", "the broker's own, on MESSAGE"),
    _rule("redelivered", "SEND", "dropped", "ActiveMQ", "the broker's own, on MESSAGE"),
    _rule("JMSXDeliveryCount", "SEND", "dropped", "JMS", "the broker's own, on MESSAGE"),
    _rule(
        "original-destination", "SEND", "dropped", "ActiveMQ", "the broker's own, on a dead letter"
    ),
    _rule(
        "dead-letter-reason", "SEND", "dropped", "mpbroker", "the broker's own, on a dead letter"
    ),
    _rule("expired-from", "SEND", "dropped", "mpbroker", "the broker's own, on an expired copy"),
    _rule("JMSXGroupID", "SEND", "refused", "JMS, ActiveMQ", "message groups are " + _NOT_YET),
    _rule("JMSXGroupSeq", "SEND", "refused", "JMS, ActiveMQ", "message groups are " + _NOT_YET),
    _rule(
        "JMSXUserID",
        "SEND",
        "dropped",
        "JMS, ActiveMQ",
        "set by a broker that checks it (ActiveMQ's populateJMSXUserID); mpbroker does not "
        "set it yet, and a producer's copy could be forged",
    ),
    _rule("JMSDeliveryTime", "SEND", "refused", "JMS 2.0", "scheduled delivery is " + _NOT_YET),
    _rule(
        "AMQ_SCHEDULED_DELAY",
        "SEND",
        "refused",
        "ActiveMQ",
        "scheduled delivery is " + _NOT_YET,
        default="0",
    ),
    _rule(
        "AMQ_SCHEDULED_PERIOD",
        "SEND",
        "refused",
        "ActiveMQ",
        "scheduled delivery is " + _NOT_YET,
        default="0",
    ),
    _rule(
        "AMQ_SCHEDULED_REPEAT",
        "SEND",
        "refused",
        "ActiveMQ",
        "scheduled delivery is " + _NOT_YET,
        default="0",
    ),
    _rule("AMQ_SCHEDULED_CRON", "SEND", "refused", "ActiveMQ", "scheduled delivery is " + _NOT_YET),
    _rule("_AMQ_SCHED_DELIVERY", "SEND", "refused", "Artemis", "scheduled delivery is " + _NOT_YET),
    _rule("_AMQ_DUPL_ID", "SEND", "refused", "Artemis", "duplicate detection is " + _NOT_YET),
    _rule("_AMQ_LVQ_NAME", "SEND", "refused", "Artemis", "last-value queues are " + _NOT_YET),
    _rule("_AMQ_GROUP_ID", "SEND", "refused", "Artemis", "message groups are " + _NOT_YET),
    _rule(
        "transformation",
        ("SEND", "SUBSCRIBE"),
        "refused",
        "ActiveMQ",
        "message transformations (JSON, XML, maps) are not supported; `jms-byte` asks for the "
        "body as bytes, as every body is here",
        default="jms-byte",
    ),
    # RabbitMQ's queue arguments: on SEND and SUBSCRIBE they declare the queue.
    *(
        _rule(
            name,
            ("SEND", "SUBSCRIBE"),
            "refused",
            "RabbitMQ",
            "RabbitMQ queue arguments are not supported: set limits, expiry and dead "
            "letters in `[destinations]` ([configuration.md](configuration.md))",
        )
        for name in (
            "x-dead-letter-exchange",
            "x-dead-letter-routing-key",
            "x-expires",
            "x-max-length",
            "x-max-length-bytes",
            "x-max-priority",
            "x-message-ttl",
            "x-overflow",
            "x-queue-mode",
            "x-queue-type",
            "x-max-age",
            "x-stream-max-segment-size-bytes",
            "x-stream-filter-size-bytes",
            "x-single-active-consumer",
        )
    ),
    _rule(
        "x-*",
        "SEND",
        "carried",
        "RabbitMQ",
        "an `x-` header RabbitMQ does not read is an application header",
    ),
    # -- SUBSCRIBE -----------------------------------------------------------------------
    _rule(
        "destination",
        ("SUBSCRIBE", "UNSUBSCRIBE"),
        "honoured",
        "STOMP",
        "`/queue/NAME` or `/topic/NAME`; on UNSUBSCRIBE, the id in STOMP 1.0 and 1.1",
    ),
    _rule(
        "id",
        ("SUBSCRIBE", "UNSUBSCRIBE", "ACK", "NACK"),
        "honoured",
        "STOMP",
        "the subscription's id; on ACK and NACK (1.2) the MESSAGE's `ack`",
    ),
    _rule("ack", "SUBSCRIBE", "honoured", "STOMP", "`auto`, `client` or `client-individual`"),
    _rule("selector", "SUBSCRIBE", "honoured", "JMS", "[selectors.md](selectors.md)"),
    _rule(
        "activemq.prefetchSize",
        "SUBSCRIBE",
        "honoured",
        "ActiveMQ",
        "the window of unacknowledged messages",
    ),
    _rule(
        "prefetch-count",
        "SUBSCRIBE",
        "honoured",
        "RabbitMQ",
        "the window (when `activemq.prefetchSize` is absent)",
    ),
    _rule(
        "activemq.subscriptionName",
        _DURABLE_FRAMES,
        "honoured",
        "ActiveMQ",
        "a durable subscription ([persistence.md](persistence.md))",
    ),
    _rule(
        "activemq.subcriptionName",
        _DURABLE_FRAMES,
        "honoured",
        "ActiveMQ 4",
        "as `activemq.subscriptionName` (the old misspelling some clients still send)",
    ),
    _rule(
        "durable-subscription-name",
        _DURABLE_FRAMES,
        "honoured",
        "Artemis",
        "a durable subscription",
    ),
    _rule(
        "durable-subscriber-name",
        _DURABLE_FRAMES,
        "honoured",
        "Artemis",
        "a durable subscription (Artemis' older name)",
    ),
    _rule(
        "durable",
        _DURABLE_FRAMES,
        "honoured",
        "RabbitMQ",
        "`true`: a durable subscription named by the `id`",
        boolean=True,
    ),
    _rule("persistent", _DURABLE_FRAMES, "honoured", "RabbitMQ", "as `durable`", boolean=True),
    _rule(
        "subscription-type",
        "SUBSCRIBE",
        "honoured",
        "Artemis",
        "`ANYCAST` on a queue, `MULTICAST` on a topic; anything else is refused",
    ),
    _rule(
        "activemq.dispatchAsync",
        "SUBSCRIBE",
        "ignored",
        "ActiveMQ",
        "harmless: pipeline workers always dispatch on their own, never in the producer's turn",
    ),
    _rule(
        "browser",
        "SUBSCRIBE",
        "refused",
        "ActiveMQ",
        "queue browsing is " + _NOT_YET,
        default="false",
        boolean=True,
    ),
    _rule(
        "activemq.exclusive",
        "SUBSCRIBE",
        "refused",
        "ActiveMQ",
        "exclusive consumers are " + _NOT_YET,
        default="false",
        boolean=True,
    ),
    _rule(
        "activemq.priority",
        "SUBSCRIBE",
        "refused",
        "ActiveMQ",
        "consumer priorities are " + _NOT_YET,
        default="0",
    ),
    _rule(
        "activemq.retroactive",
        "SUBSCRIBE",
        "refused",
        "ActiveMQ",
        "retroactive consumers are " + _NOT_YET,
        default="false",
        boolean=True,
    ),
    _rule(
        "activemq.noLocal",
        "SUBSCRIBE",
        "refused",
        "ActiveMQ",
        "no-local subscriptions are " + _NOT_YET,
        default="false",
        boolean=True,
    ),
    _rule(
        "no-local",
        "SUBSCRIBE",
        "refused",
        "Artemis",
        "no-local subscriptions are " + _NOT_YET,
        default="false",
        boolean=True,
    ),
    _rule(
        "activemq.maximumPendingMessageLimit",
        "SUBSCRIBE",
        "refused",
        "ActiveMQ",
        "discarding a slow consumer's messages is not supported: flow control slows the "
        "producers instead",
        default="0",
    ),
    _rule(
        "consumer-window-size",
        "SUBSCRIBE",
        "refused",
        "Artemis",
        "a window in bytes is not supported: use `activemq.prefetchSize` (messages)",
    ),
    _rule(
        "x-queue-name",
        "SUBSCRIBE",
        "refused",
        "RabbitMQ",
        "naming a subscription's queue is not supported: use a durable subscription",
    ),
    _rule("x-stream-offset", "SUBSCRIBE", "refused", "RabbitMQ", "streams are not supported"),
    _rule("x-stream-filter", "SUBSCRIBE", "refused", "RabbitMQ", "streams are not supported"),
    _rule(
        "x-stream-match-unfiltered", "SUBSCRIBE", "refused", "RabbitMQ", "streams are not supported"
    ),
    *(
        _rule(
            flag,
            "SUBSCRIBE",
            "honoured",
            "RabbitMQ",
            "the subscription's queue as mpbroker makes it is accepted: `true` for a topic "
            "subscription that is not durable, `false` for a durable one or a queue's; the "
            "other value is refused",
            boolean=True,
        )
        for flag in ("auto-delete", "exclusive")
    ),
    # -- UNSUBSCRIBE ---------------------------------------------------------------------
    _rule(
        "client-id",
        "UNSUBSCRIBE",
        "honoured",
        "Artemis",
        "must be the connection's `client-id`, else refused",
    ),
    # -- ACK and NACK --------------------------------------------------------------------
    _rule("message-id", ("ACK", "NACK"), "honoured", "STOMP", "the message (STOMP 1.0 and 1.1)"),
    _rule(
        "subscription", ("ACK", "NACK"), "honoured", "STOMP", "the subscription (STOMP 1.0 and 1.1)"
    ),
    _rule(
        "requeue",
        "NACK",
        "honoured",
        "RabbitMQ",
        "`false` dead-letters the message at once; `true` (default) puts it back",
        boolean=True,
    ),
    # -- the families, last: a name above wins -------------------------------------------
    _rule("activemq.*", _EVERY_FRAME, "refused", "ActiveMQ", _FAMILY_NOTE),
    _rule("JMSX*", _EVERY_FRAME, "refused", "JMS", _FAMILY_NOTE),
    _rule("AMQ_*", _EVERY_FRAME, "refused", "ActiveMQ", _FAMILY_NOTE),
    _rule("_AMQ_*", _EVERY_FRAME, "refused", "Artemis", _FAMILY_NOTE),
    _rule("x-*", _EVERY_FRAME, "refused", "RabbitMQ", _FAMILY_NOTE),
)


def _index() -> tuple[dict[tuple[str, str], HeaderRule], dict[tuple[str, str], HeaderRule]]:
    """(frame, name) -> rule, and (frame, family prefix) -> rule; the first rule for a
    pair wins, so a frame's own rule comes before a family's every-frame one."""
    names: dict[tuple[str, str], HeaderRule] = {}
    families: dict[tuple[str, str], HeaderRule] = {}
    for rule in RULES:
        table = families if rule.family else names
        key_name = rule.header.removesuffix("*")
        for frame in rule.frames:
            table.setdefault((frame, key_name), rule)
    return names, families


_NAMES, _FAMILY_RULES = _index()


def rule_for(command: str, header: str) -> HeaderRule | None:
    """The rule for `header` on a `command` frame (STOMP counts as CONNECT), or None: a
    header no rule names, carried on SEND and ignored elsewhere."""
    frame = "CONNECT" if command == "STOMP" else command
    rule = _NAMES.get((frame, header))
    if rule is not None:
        return rule
    for prefix in FAMILIES:
        if header.startswith(prefix):
            return _FAMILY_RULES.get((frame, prefix))
    return None


#: The SEND headers whose rule asks more of the session than carrying them: it looks
#: these, and every header of a family, up (`rule_for`); the others it just carries.
SEND_ATTENTION: Final = frozenset(
    rule.header
    for rule in RULES
    if "SEND" in rule.frames
    and not rule.family
    and (rule.treatment in ("dropped", "refused") or rule.boolean)
) | {"reply-to", "user-id", "destination-type"}


#: The broker's own headers, removed from a SEND.
DROPPED_FROM_SEND: Final = frozenset(
    rule.header for rule in RULES if "SEND" in rule.frames and rule.treatment == "dropped"
)

#: Per frame other than SEND, the names it honours whatever their value: the session looks
#: up only the others (an ACK is as frequent as a SEND).
HONOURED: Final = {
    frame: frozenset(
        rule.header
        for rule in RULES
        if frame in rule.frames
        and not rule.family
        and rule.treatment == "honoured"
        and rule_for(frame, rule.header) is rule
    )
    for frame in FRAMES
    if frame != "SEND"
}


def markdown_table() -> str:
    """The rules as docs/headers.md shows them: a row per header and frame group."""
    lines = [
        "| header | frames | treatment | from | what mpbroker does |",
        "| --- | --- | --- | --- | --- |",
    ]
    for rule in RULES:
        frames = "every frame" if rule.frames == _EVERY_FRAME else ", ".join(rule.frames)
        if rule.frames == _AFTER_CONNECT:
            frames = "every frame but CONNECT"
        treatment: str = rule.treatment
        if rule.default is not None:
            treatment = f"refused (but `{rule.default}` is accepted)"
        if rule.boolean:
            treatment += "; boolean"
        note = rule.note.replace("|", "\\|")
        lines.append(f"| `{rule.header}` | {frames} | {treatment} | {rule.source} | {note} |")
    return "\n".join(lines) + "\n"
