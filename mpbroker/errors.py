"""What the broker refuses to do for a client, as typed errors that build their own text.

Each becomes one ERROR frame: its `message` header is the error's `message`, its body the
`detail` (what was or was not done, and what the client can do about it); the connection
closes after it. The texts follow ActiveMQ's `ResourceAllocationException` where a limit is
the reason, so clients that look for that word keep working.

Pipelines build them too: the `Refuse` record carries `message` and `detail` to the gateway.
"""

from __future__ import annotations

__all__ = [
    "AuthenticationFailed",
    "ConnectionRefused",
    "DestinationLimitReached",
    "Displaced",
    "LimitReached",
    "MessageTooLarge",
    "NeverFits",
    "Refusal",
    "UnsupportedHeader",
]


class Refusal(Exception):
    """Something a client asked for that the broker will not do; the base of every error
    that becomes an ERROR frame (a client's protocol mistake included)."""

    def __init__(self, message: str, detail: str = "") -> None:
        self.message = message
        self.detail = detail
        super().__init__(message)


class LimitReached(Refusal):
    """A limit stopped a message or a request: ``ResourceAllocation: <where> <limit> <value>
    reached``, e.g. ``ResourceAllocation: /queue/orders msg_high 5000 reached``.

    `where` is the destination (or what else the limit is of, such as ``transactions``);
    `limit` the setting's name, or a name and its value where the limit has several parts
    (``quota default max_messages 10, max_bytes 1048576``); `value` the limit's value, when
    `limit` does not already say it.
    """

    def __init__(
        self, where: str, limit: str, value: int | str | None = None, detail: str = ""
    ) -> None:
        self.where = where
        self.limit = limit
        self.value = value
        shown = limit if value is None else f"{limit} {value}"
        super().__init__(f"ResourceAllocation: {where} {shown} reached", detail)


class DestinationLimitReached(LimitReached):
    """A SEND or SUBSCRIBE that would make one destination more than the broker may hold
    (`broker.max_destinations`, over every pipeline): ``ResourceAllocation: <destination>
    broker.max_destinations <limit> reached``. `frame` is what was refused (SEND:
    nothing was sent; SUBSCRIBE: nothing was subscribed). The destinations that exist keep
    working."""

    def __init__(self, destination: str, limit: int, frame: str = "SEND") -> None:
        self.destination = destination
        self.frame = frame
        undone = (
            "Nothing was subscribed" if frame == "SUBSCRIBE" else "The message was not accepted"
        )
        super().__init__(
            destination,
            "broker.max_destinations",
            limit,
            f"{undone}: the broker holds {limit} destinations (queues, topics with "
            f"subscribers, durable subscriptions), as many as broker.max_destinations lets "
            f"it, and {destination} would be one more. The destinations in use work as "
            "before. Use one of them, wait until some are idle (an empty queue without "
            "consumers and a topic without subscribers are forgotten), or raise "
            "broker.max_destinations (by default it is derived from memory.max_memory: "
            "mpbroker config show).",
        )


class NeverFits(Refusal):
    """A message larger than a limit could ever make room for: ``ResourceAllocation: <where>
    <limit>: a <size>-byte message can never fit``."""

    def __init__(self, where: str, limit: str, size: int, detail: str = "") -> None:
        self.where = where
        self.limit = limit
        self.size = size
        super().__init__(
            f"ResourceAllocation: {where} {limit}: a {size}-byte message can never fit", detail
        )


class MessageTooLarge(Refusal):
    """A SEND whose body is above `memory.max_message_bytes`."""

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(
            f"message body of {size} bytes exceeds max_message_bytes {limit}",
            "The message was not accepted: send smaller messages, or raise "
            "[memory] max_message_bytes.",
        )


class AuthenticationFailed(Refusal):
    """A CONNECT whose login and passcode do not name a user, or without a login where
    anonymous connections are not allowed. The same words for every case: the client
    learns nothing about which names exist."""

    def __init__(self) -> None:
        super().__init__("authentication failed")


class ConnectionRefused(Refusal):
    """A connection the broker will not serve: `reason` says why (``max_connections 50
    reached``, ``broker is shutting down``). Its ERROR is the only frame the client gets."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"connection refused: {reason}")


class Displaced(Refusal):
    """A connection that had not completed CONNECT, closed to give its place to a newer one:
    `limit` (``max_connections`` or ``max_connections_connecting``) was reached at `value`."""

    def __init__(self, limit: str, value: int) -> None:
        self.limit = limit
        self.value = value
        super().__init__(
            f"connection closed to make room: {limit} {value} reached before its CONNECT",
            "The broker closes its oldest connections that have not completed CONNECT when "
            "new ones need their places. Send CONNECT as soon as the connection is open.",
        )


class AccessDenied(Refusal):
    """A frame asked for something the user's permissions ([[security.acl]]) do not grant:
    `permission` is read, write or admin."""

    def __init__(self, user: str, permission: str, destination: str, detail: str = "") -> None:
        self.user = user
        self.permission = permission
        self.destination = destination
        super().__init__(f"access denied: user {user} may not {permission} {destination}", detail)


class ReceiptInDoubt(Refusal):
    """A receipt nobody can honestly give: the pipeline worker that owed it restarted
    `when` ("before answering it", or "after this connection sent to it"), and the frames
    it covers may or may not have been handled."""

    def __init__(self, receipt: str, when: str = "before answering it") -> None:
        self.receipt = receipt
        super().__init__(
            f"receipt {receipt!r} in doubt: a broker worker restarted {when}",
            "The frames it covers (a SEND, an ACK, a COMMIT's messages, or for a DISCONNECT "
            "everything before it) may or may not have been handled. Send again what must "
            "arrive; a message sent again may then arrive twice.",
        )


class UnsupportedHeader(Refusal):
    """A header another broker honours and mpbroker does not (yet), on a `command` frame:
    refused by name, so that nothing the client counts on is silently ignored
    (docs/headers.md). `reason` says what the header asks for."""

    def __init__(self, command: str, header: str, reason: str) -> None:
        self.command = command
        self.header = header
        self.reason = reason
        shown = header if len(header) <= 100 else header[:100] + "..."
        super().__init__(
            f"unsupported header {shown} on {command}: {reason}",
            f"Nothing of the {command} took effect. docs/headers.md lists the headers "
            "mpbroker reads and what it does with each.",
        )
