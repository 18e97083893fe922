"""Expiry policies: the log line format and the per-queue policy lookup."""

from __future__ import annotations

from functools import partial

import pytest

from mpbroker.config import config_from_mapping, parse_log_fields
from mpbroker.flow import ExpiryPolicy, expired_log_line, expiry_policies
from tests.factories import make_message

#: The message of these tests; its headers are given.
message = partial(make_message, "ID-1-0.0-7", "/queue/cars", body=b"", priority=7)


def test_the_log_line_has_weblogics_shape_with_the_chosen_fields() -> None:
    line = expired_log_line(
        message(headers={"Make": "Honda", "Model": "Civic"}), ("%header%", "%properties%")
    )
    assert line.startswith("<ExpiredJMSMessage JMSMessageID='ID-1-0.0-7' > <HeaderFields ")
    assert "JMSPriority='7'" in line and "JMSRedelivered='false'" in line
    assert line.endswith("<UserProperties Make='Honda' Model='Civic' /> </ExpiredJMSMessage>")


def test_named_fields_only_and_values_cut_at_32_characters() -> None:
    line = expired_log_line(
        message(headers={"Make": "x" * 40, "Color": "red"}), ("JMSPriority", "Make")
    )
    assert line == (
        "<ExpiredJMSMessage JMSMessageID='ID-1-0.0-7' > <HeaderFields JMSPriority='7' /> "
        f"<UserProperties Make='{'x' * 32}' /> </ExpiredJMSMessage>"
    )


def test_log_fields_must_be_a_list_of_names() -> None:
    assert parse_log_fields("%header%, Make") == ("%header%", "Make")
    with pytest.raises(ValueError):
        parse_log_fields("Make,,Model")


def test_policies_come_from_destination_tables_over_the_queue_defaults() -> None:
    config = config_from_mapping(
        {
            "queues": {"expiry_policy": "log", "expiry_log_fields": "%header%"},
            "destinations": {
                "/queue/cars.*": {"expiry_policy": "redirect", "expiry_destination": "/queue/old"}
            },
        }
    )
    local = expiry_policies(config, owns=lambda queue: True)
    assert local("/queue/bikes") == ExpiryPolicy("log", ("%header%",))
    assert local("/queue/cars.eu") == ExpiryPolicy("redirect", ("%header%",), "/queue/old")
    # Another worker's queue cannot be written from here: the dead-letter queue instead.
    remote = expiry_policies(config, owns=lambda queue: False)
    assert remote("/queue/cars.eu").destination == ""
