"""The export's row schema (versioned) and how a stored message becomes a row. Pure.

Everything here works on plain values read from the store files; nothing opens a file.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from mpbroker.storefiles import OUTCOMES

__all__ = [
    "COLUMNS",
    "PENDING",
    "READABLE_SCHEMA_VERSIONS",
    "ROW_OUTCOMES",
    "SCHEMA_VERSION",
    "SETTLED_UNKNOWN",
    "STANDARD_HEADERS",
    "UPDATE_COLUMNS",
    "Column",
    "SourceMessage",
    "build_row",
    "column_names",
    "kind_of",
    "outcome_of",
    "parse_since",
    "split_headers",
]

# Bump when a column is added, removed or changes meaning; readers check it (the Parquet
# files' metadata key `mpbroker.export.schema_version` and the manifest's `schema_version`).
# 2: update files (UPDATE_COLUMNS) beside the row files; the row columns are version 1's.
SCHEMA_VERSION: Final = 2
# Versions whose files this code reads (a version 1 export directory is carried on).
READABLE_SCHEMA_VERSIONS: Final = frozenset({1, 2})

PENDING: Final = "pending"
"""The outcome of a message not settled yet (a queue message waiting or delivered and not
acked; a topic message some durable subscription still owes an ack for)."""
SETTLED_UNKNOWN: Final = "settled"
"""The outcome of a message exported as pending and settled since, whose outcome is gone:
its segment was retired (all settled) and deleted, without ``store.archive``, before an
export read how."""
ROW_OUTCOMES: Final = frozenset(OUTCOMES | {PENDING, SETTLED_UNKNOWN})

# Headers with a meaning to STOMP, JMS or the broker; every other header a sender set is a
# user property. (The gateway has already dropped frame-control headers such as receipt.)
STANDARD_HEADERS: Final = frozenset(
    {
        "content-type",
        "correlation-id",
        "reply-to",
        "type",
        "persistent",
        "priority",
        "expires",
        "ttl",
        "original-destination",
        "expired-from",
        "dead-letter-reason",
        "JMSXGroupID",
        "JMSXGroupSeq",
    }
)


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str
    """The Arrow type, as the schema table of docs/export-and-spark.md names it."""
    nullable: bool
    doc: str


COLUMNS: Final[tuple[Column, ...]] = (
    Column("message_id", "string", False, "the broker's message-id"),
    Column("destination", "string", False, "e.g. /queue/orders"),
    Column("kind", "string", False, "queue or topic (from the destination)"),
    Column("persistent", "bool", False, "always true: only persistent messages are stored"),
    Column("priority", "int8", False, "JMS priority 0-9"),
    Column("timestamp", "timestamp[ms, UTC]", False, "when the broker received (and stored) it"),
    Column("expires", "timestamp[ms, UTC]", True, "expiry time; null when it never expires"),
    Column(
        "redeliveries", "int32", False, "delivery attempts that came back (NACK, consumer gone)"
    ),
    Column("size_bytes", "int64", False, "stored size: body (as stored) plus header text"),
    Column("headers", "map<string, string>", False, "standard STOMP/JMS headers"),
    Column("properties", "map<string, string>", False, "the sender's other headers"),
    Column("body", "binary", True, "the body as sent (decompressed); absent with --no-body"),
    Column("outcome", "string", False, "acked, expired, dead-lettered, unsubscribed or pending"),
    Column("settled_at", "timestamp[ms, UTC]", True, "when it was settled; null while pending"),
    Column(
        "pending_subscriptions",
        "int32",
        True,
        "topics: durable subscriptions still owing an ack; null for queues",
    ),
    Column("store", "string", False, "source store directory, e.g. p2p-0"),
    Column("segment", "int32", False, "source segment number (seg-N.db)"),
    Column("seq", "int64", False, "the store's sequence number (unique within a store)"),
)


# An update file's rows: the current outcome of rows an earlier run exported as pending,
# with what the ingest needs to find them in its table (the key, and the partition values
# destination and day from the timestamp).
UPDATE_COLUMNS: Final[tuple[Column, ...]] = (
    Column("store", "string", False, "source store directory, e.g. p2p-0"),
    Column("segment", "int32", False, "source segment number (seg-N.db)"),
    Column("seq", "int64", False, "the store's sequence number"),
    Column("message_id", "string", False, "the broker's message-id"),
    Column("destination", "string", False, "e.g. /queue/orders"),
    Column("timestamp", "timestamp[ms, UTC]", False, "when the broker received it"),
    Column("outcome", "string", False, "the outcome it has now (never pending)"),
    Column("settled_at", "timestamp[ms, UTC]", True, "when it was settled, if known"),
    Column("redeliveries", "int32", False, "delivery attempts that came back, in all"),
)


def column_names(include_body: bool) -> list[str]:
    return [c.name for c in COLUMNS if include_body or c.name != "body"]


def kind_of(destination: str) -> str:
    """'topic' for /topic/..., else 'queue' (the broker routes every other name to a queue)."""
    return "topic" if destination.startswith("/topic/") else "queue"


def split_headers(headers: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(standard headers, user properties)."""
    standard: dict[str, str] = {}
    properties: dict[str, str] = {}
    for key, value in headers.items():
        (standard if key in STANDARD_HEADERS else properties)[key] = value
    return standard, properties


def outcome_of(settlement: tuple[str, int] | None) -> tuple[str, int | None]:
    """(outcome, settled_at_ms) from a message's settlement row (outcome, at_ms), if any."""
    if settlement is None:
        return PENDING, None
    # An outcome a newer broker wrote is kept as it is rather than guessed at.
    outcome, at_ms = settlement
    return outcome, at_ms


def parse_since(text: str) -> int:
    """`--since` as epoch ms: an integer (epoch ms) or an ISO-8601 time (UTC when it has
    no offset). ValueError naming the text otherwise."""
    stripped = text.strip()
    if stripped.isdigit():
        return int(stripped)
    try:
        when = dt.datetime.fromisoformat(stripped.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"--since {text!r}: give an ISO-8601 time (2026-11-23T06:00:00Z) or epoch ms"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class SourceMessage:
    """One message row of a segment, headers decoded and body decompressed."""

    seq: int
    message_id: str
    destination: str
    headers: Mapping[str, str]
    body: bytes
    timestamp_ms: int
    priority: int
    expires_ms: int
    size: int


def build_row(
    message: SourceMessage,
    *,
    store: str,
    segment: int,
    deliveries: int,
    settlement: tuple[str, int] | None,
    pending_subscriptions: int | None,
    include_body: bool,
) -> dict[str, object]:
    """The export row of one stored message, keyed by column name (`column_names` order).

    Timestamps stay epoch ms (ints): the Parquet writer types them as timestamp[ms, UTC].
    """
    standard, properties = split_headers(message.headers)
    outcome, settled_at = outcome_of(settlement)
    kind = kind_of(message.destination)
    row: dict[str, object] = {
        "message_id": message.message_id,
        "destination": message.destination,
        "kind": kind,
        "persistent": True,
        "priority": message.priority,
        "timestamp": message.timestamp_ms,
        "expires": message.expires_ms or None,
        "redeliveries": deliveries,
        "size_bytes": message.size,
        "headers": standard,
        "properties": properties,
        "body": message.body,
        "outcome": outcome,
        "settled_at": settled_at,
        "pending_subscriptions": (pending_subscriptions or 0) if kind == "topic" else None,
        "store": store,
        "segment": segment,
        "seq": message.seq,
    }
    if not include_body:
        del row["body"]
    return row
