"""Option parsing and validation of `mpbroker bench` (no processes started)."""

from __future__ import annotations

import argparse

import pytest

from mpbroker.loadgen.cli import add_arguments, run_from_args, scenario_from_args


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults_describe_a_queue_one_to_one() -> None:
    scenario = scenario_from_args(_parse())
    assert scenario.label == "queue 1->1 100B auto"
    assert scenario.expected_deliveries == 100_000
    assert scenario.count == 100_000 and scenario.prefetch == 1000


def test_topic_deliveries_multiply_by_consumers() -> None:
    scenario = scenario_from_args(
        _parse("--destination", "/topic/t", "--producers", "2", "--consumers", "4", "--count", "10")
    )
    assert scenario.is_topic
    assert scenario.expected_deliveries == 80
    assert scenario.label == "topic 2->4 100B auto"


def test_ack_every_defaults_to_at_most_half_the_window() -> None:
    assert scenario_from_args(_parse("--ack", "client", "--prefetch", "10")).ack_every == 5
    assert scenario_from_args(_parse("--ack", "client")).ack_every == 250


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--size", "10"], "--size must be at least"),
        (["--consumers", "0"], "--consumers must be at least 1"),
        (["--destination", "bench"], "/queue/NAME or /topic/NAME"),
        (["--ack-every", "2000"], "--ack-every must be between"),
        (["--port", "61613", "--gateways", "2"], "--gateways applies"),
        (["--server-pid", "1"], "--server-pid applies with --port"),
        (["--timeout", "0"], "--timeout must be positive"),
    ],
)
def test_invalid_options_exit_2_with_a_reason(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_from_args(_parse(*argv)) == 2
    assert message in capsys.readouterr().err


def test_every_option_has_help() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    undocumented = [action.dest for action in parser._actions if action.help is None]
    assert undocumented == []
