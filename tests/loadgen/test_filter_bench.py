"""`mpbroker bench --filters / --filter-targets`: options, the grid, the report (no processes:
a fake runner stands in for the broker)."""

from __future__ import annotations

import argparse
import json

import pytest

from mpbroker.loadgen.cli import add_arguments, run_from_args
from mpbroker.loadgen.filterbench import (
    QUEUE,
    TOPIC,
    FilterOptions,
    Study,
    filter_options_from_args,
    fits,
    format_json,
    format_report,
    study,
    targets,
)
from mpbroker.loadgen.filterproc import FilterPoint, subscribe_frames
from mpbroker.loadgen.filterrun import FilterRunResult
from mpbroker.loadgen.filters import NO_FILTER, FilterCheck, FilterPlan
from mpbroker.loadgen.model import Fit
from mpbroker.stomp import CLIENT_COMMANDS, FrameParser


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def _options(*argv: str) -> FilterOptions:
    return filter_options_from_args(_parse("--filters", *argv))


def test_defaults_are_the_papers_grid() -> None:
    options = _options()
    assert options.study and not options.targets
    assert options.subscribers == (1, 10, 100, 1000, 10_000)
    assert options.kinds == ("simple", "and", "or", "in")
    assert (options.components, options.replication, options.connections) == (5, (1,), 4)
    grid = options.grid()
    assert len(grid) == 20
    assert grid[0] == FilterPlan(1, "simple", 1, 1, message_components=5)
    assert grid[-1] == FilterPlan(10_000, "in", 5, 1, message_components=5)
    # Every point's messages carry the same properties.
    assert {plan.message_components for plan in grid} == {5}


def test_replication_grades_skip_points_with_fewer_subscribers() -> None:
    options = _options(
        "--filter-subscribers", "1,10,100", "--filter-kinds", "or", "--replication", "1,10"
    )
    assert [(p.subscribers, p.replication) for p in options.grid()] == [
        (1, 1),
        (10, 1),
        (100, 1),
        (10, 10),
        (100, 10),
    ]


def test_points_use_the_shared_options() -> None:
    options = _options("--count", "500", "--size", "64", "--filter-connections", "3")
    point = options.point(FilterPlan(2, "simple"), TOPIC)
    assert point.connections == 2  # never more connections than subscribers
    assert (point.count, point.min_count, point.size_bytes) == (500, 200, 64)
    assert options.point(FilterPlan(10, "simple"), TOPIC).connections == 3
    assert options.point(FilterPlan(10, "simple"), TOPIC).topic


def test_the_targets() -> None:
    (topic, topic_min, subject, reference), (queue, queue_min, q_subject, q_reference) = targets(
        _options()
    )
    assert (topic_min, queue_min) == (0.8, 0.5)
    assert subject.destination == reference.destination == TOPIC
    assert subject.plan == FilterPlan(10_001, "simple")  # subscriber 0 matches, 10,000 do not
    assert reference.plan == FilterPlan(1, "simple")
    assert q_subject.destination == q_reference.destination == QUEUE
    assert q_subject.plan == FilterPlan(100, "simple", keys=100)
    assert q_reference.plan.kind == NO_FILTER and q_reference.plan.subscribers == 1
    assert "10,000 non-matching" in topic and "100 consumers" in queue


def test_subscribe_frames_spread_subscribers_and_ask_one_receipt() -> None:
    point = FilterPoint(FilterPlan(10, "in", 2), TOPIC, 3, 100, 10, 1.0)
    frames = [
        frame
        for chunk in subscribe_frames(point, 1)
        for frame in FrameParser(commands=CLIENT_COMMANDS).feed(chunk)
    ]
    assert [f.headers["id"] for f in frames] == ["1", "4", "7"]
    assert frames[0].headers["selector"] == "ID IN ('k1', 'k11')"
    assert [f.headers.get("receipt") for f in frames] == [None, None, "subscribed"]
    assert {f.headers["destination"] for f in frames} == {TOPIC}
    plain = FilterPoint(FilterPlan(2, NO_FILTER, replication=2), QUEUE, 2, 100, 10, 1.0)
    (chunk,) = subscribe_frames(plain, 0)
    (frame,) = FrameParser(commands=CLIENT_COMMANDS).feed(chunk)
    assert "selector" not in frame.headers


def test_a_point_needs_a_subscriber_per_connection() -> None:
    with pytest.raises(ValueError, match="4 connections for 2 subscribers"):
        FilterPoint(FilterPlan(2, "simple"), TOPIC, 4, 100, 10, 1.0)
    with pytest.raises(ValueError, match=r"min_count 200 is not within 1 \.\. 100"):
        FilterPoint(FilterPlan(2, "simple"), TOPIC, 1, 100, 200, 1.0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--filters", "--filter-subscribers", "1,ten"], "--filter-subscribers takes"),
        (["--filters", "--filter-subscribers", "0,10"], "--filter-subscribers values must"),
        (["--filters", "--filter-kinds", "simple,xor"], "--filter-kinds: unknown kind 'xor'"),
        (["--filters", "--filter-components", "0"], "--filter-components must be at least 1"),
        (["--filters", "--replication", "0"], "--replication values must be at least 1"),
        (
            ["--filters", "--filter-subscribers", "1,10", "--replication", "20"],
            "--replication 20 exceeds every --filter-subscribers value",
        ),
        (["--filters", "--filter-connections", "0"], "--filter-connections must be at least"),
        (["--filters", "--filter-seconds", "0"], "--filter-seconds must be positive"),
        (["--filter-targets", "--count", "0"], "--count must be at least 1"),
        (["--filters", "--size", "5"], "--size must be at least"),
        (["--filters", "--consumers", "3"], "--consumers does not apply to --filters"),
        (["--filter-targets", "--destination", "/topic/x"], "--destination does not apply"),
        (["--filters", "--baseline"], "--baseline does not apply"),
        (["--filters", "--ack", "client"], "--ack does not apply"),
        (["--filters", "--port", "1", "--gateways", "1"], "--gateways applies to a broker"),
        (["--filter-kinds", "or"], "--filter-kinds applies with --filters or --filter-targets"),
        (["--replication", "2"], "--replication applies with --filters"),
    ],
)
def test_invalid_options_exit_2_with_one_line_naming_the_option(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_from_args(_parse(*argv)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, lines
    assert message in lines[0]


def _fake_result(point: FilterPoint) -> FilterRunResult:
    """What a broker whose filters cost 100 ns per component on top of 20 us would give."""
    plan = point.plan
    us = 20.0 + 0.1 * plan.subscribers * plan.filter_components + 5.0 * plan.replication
    sent = 1000
    expected = plan.expected_deliveries(sent, topic=point.topic)
    check = FilterCheck(expected, expected, 0, 0, 0, 0, 0, point.topic)
    return FilterRunResult(
        point,
        sent,
        check,
        elapsed_s=sent * us / 1e6,
        server_cpu_s=sent * us / 1e6,
        client_cpu_s=0.001,
        subscribe_s=0.01,
    )


def test_a_study_with_a_fake_broker_is_fitted_and_reported() -> None:
    options = _options(
        "--filter-subscribers",
        "1,10,100,1000",
        "--filter-kinds",
        "simple,or",
        "--replication",
        "1,2",
        "--filter-targets",
        "--repeat",
        "2",
    )
    ran: list[FilterPoint] = []

    def run(point: FilterPoint) -> FilterRunResult:
        ran.append(point)
        return _fake_result(point)

    result = study(options, run)
    assert result.ok
    assert len(result.grid) == 2 * (4 + 3)
    assert len(ran) == 2 * (14 + 4)  # every point twice, the targets' four points too
    fitted = fits(result.grid)
    for basis in ("server CPU", "wall clock"):
        for kind in ("simple", "or", "all"):
            found = fitted[basis][kind]
            assert isinstance(found, Fit)
            assert found.t_fltr == pytest.approx(1e-7, rel=1e-6)
            assert found.t_tx == pytest.approx(5e-6, rel=1e-6)
            assert found.t_rcv == pytest.approx(20e-6, rel=1e-6)
    topic, queue = result.targets
    assert topic.ratio == pytest.approx(25.1 / (20.0 + 0.1 * 10_001 + 5.0))
    assert not topic.met
    assert queue.ratio == pytest.approx(25.0 / 35.0) and queue.met

    text = format_report(result, repeat=2)
    assert "selector study on /topic/bench.filters (medians of 2 runs)" in text
    assert "msgs/s (server us/msg):" in text
    assert "t_fltr ns" in text and "ActiveMQ 4.0" in text and "160 ns" in text
    assert "ratio 0.02 (target >= 0.8): NOT MET" in text
    assert "ratio 0.71 (target >= 0.5): met" in text
    assert "on server CPU (reference us/msg / subject us/msg): 0.71" in text
    assert "ok: in all 36 runs every selected delivery arrived exactly once" in text

    document = json.loads(format_json(result))
    assert document["ok"] is True
    assert len(document["points"]) == 14
    assert document["fits"]["server CPU"]["or"]["t_fltr_s"] == pytest.approx(1e-7)
    assert [t["met"] for t in document["targets"]] == [False, True]
    assert document["targets"][1]["cpu_ratio"] == pytest.approx(25.0 / 35.0, abs=1e-3)


def test_one_replication_grade_and_failures_are_reported() -> None:
    options = _options("--filter-subscribers", "1,10", "--filter-kinds", "in")

    def run(point: FilterPoint) -> FilterRunResult:
        result = _fake_result(point)
        if point.plan.subscribers == 10:
            check = FilterCheck(1000, 999, 1, 0, 0, 0, 0, True)
            return FilterRunResult(point, 1000, check, 1.0, aborted="no message for 30 s")
        return result

    result = study(options, run)
    assert not result.ok
    text = format_report(result, repeat=1)
    assert "FAILED: /topic/bench.filters in m=5 n=10 r=1: 1 MISSING" in text
    assert "aborted: no message for 30 s" in text
    # One good point left: nothing to fit.
    assert fits(result.grid)["server CPU"]["in"] == "1 points cannot determine 2 parameters"
    assert Study([], []).ok is False


def test_a_point_with_no_server_cpu_measured_says_so() -> None:
    options = _options("--filter-subscribers", "1,10,100", "--filter-kinds", "simple")

    def run(point: FilterPoint) -> FilterRunResult:
        result = _fake_result(point)
        if point.plan.subscribers == 10:
            return FilterRunResult(
                point, result.sent, result.check, result.elapsed_s, server_cpu_s=0.0
            )
        return result

    fitted = fits(study(options, run).grid)
    assert "no server CPU measured at simple n=10 r=1" in str(fitted["server CPU"]["simple"])
    assert isinstance(fitted["wall clock"]["simple"], Fit)
