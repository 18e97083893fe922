"""The export's pure parts: schema, rows, outcomes, --since."""

from __future__ import annotations

import pytest

from mpbroker.export import (
    COLUMNS,
    PENDING,
    ROW_OUTCOMES,
    SCHEMA_VERSION,
    SETTLED_UNKNOWN,
    SourceMessage,
    build_row,
    kind_of,
    parse_since,
)
from mpbroker.export._schema import column_names, split_headers
from mpbroker.stores import OUTCOMES


def source(destination: str = "/queue/a", **changes: object) -> SourceMessage:
    values: dict[str, object] = {
        "seq": 7,
        "message_id": "m-7",
        "destination": destination,
        "headers": {"content-type": "text/plain", "order": "42"},
        "body": b"hello",
        "timestamp_ms": 1_700_000_000_000,
        "priority": 6,
        "expires_ms": 0,
        "size": 30,
    }
    values.update(changes)
    return SourceMessage(**values)  # type: ignore[arg-type]


def test_the_schema_is_versioned_and_names_are_unique() -> None:
    assert SCHEMA_VERSION == 2
    names = [c.name for c in COLUMNS]
    assert len(names) == len(set(names))
    assert "body" in column_names(True)
    assert "body" not in column_names(False)


def test_outcomes_are_the_stores_plus_pending_and_settled_unknown() -> None:
    assert OUTCOMES | {PENDING, SETTLED_UNKNOWN} == ROW_OUTCOMES


@pytest.mark.parametrize(
    ("destination", "kind"),
    [("/queue/a", "queue"), ("/topic/t", "topic"), ("/queue/DLQ.a", "queue"), ("x", "queue")],
)
def test_kind_from_the_destination(destination: str, kind: str) -> None:
    assert kind_of(destination) == kind


def test_headers_split_into_standard_and_properties() -> None:
    standard, props = split_headers({"content-type": "a", "reply-to": "/queue/r", "x": "1"})
    assert standard == {"content-type": "a", "reply-to": "/queue/r"}
    assert props == {"x": "1"}


def test_a_pending_queue_row() -> None:
    row = build_row(
        source(),
        store="p2p-0",
        segment=3,
        deliveries=2,
        settlement=None,
        pending_subscriptions=None,
        include_body=True,
    )
    assert list(row) == column_names(True)
    assert row["kind"] == "queue"
    assert row["outcome"] == PENDING
    assert row["settled_at"] is None
    assert row["expires"] is None
    assert row["redeliveries"] == 2
    assert row["pending_subscriptions"] is None
    assert row["headers"] == {"content-type": "text/plain"}
    assert row["properties"] == {"order": "42"}
    assert row["body"] == b"hello"
    assert (row["store"], row["segment"], row["seq"]) == ("p2p-0", 3, 7)


def test_an_acked_topic_row_without_body() -> None:
    row = build_row(
        source("/topic/t", expires_ms=1_700_000_060_000),
        store="pubsub-0",
        segment=1,
        deliveries=0,
        settlement=("acked", 1_700_000_001_000),
        pending_subscriptions=0,
        include_body=False,
    )
    assert "body" not in row
    assert row["kind"] == "topic"
    assert (row["outcome"], row["settled_at"]) == ("acked", 1_700_000_001_000)
    assert row["expires"] == 1_700_000_060_000
    assert row["pending_subscriptions"] == 0


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("1700000000000", 1_700_000_000_000),
        ("2023-11-14T22:13:20Z", 1_700_000_000_000),
        ("2023-11-14T22:13:20", 1_700_000_000_000),
        ("2023-11-14T23:13:20+01:00", 1_700_000_000_000),
    ],
)
def test_since_takes_iso_or_epoch_ms(text: str, ms: int) -> None:
    assert parse_since(text) == ms


def test_since_refuses_other_text() -> None:
    with pytest.raises(ValueError, match="yesterday"):
        parse_since("yesterday")
