"""Tally and check: exactly-once, per-producer order, queue unions, foreign bodies."""

from __future__ import annotations

from mpbroker.loadgen.tally import Tally, check
from mpbroker.loadgen.wire import body_prefix, make_body

TOKEN = b"0badcafe"


def _tally(deliveries: list[tuple[int, int]], *, producers: int = 2, count: int = 5) -> Tally:
    tally = Tally(body_prefix(TOKEN), producers, count)
    tally.add(make_body(TOKEN, p, s, 40) for p, s in deliveries)
    return tally


def _all(producers: int = 2, count: int = 5) -> list[tuple[int, int]]:
    return [(p, s) for s in range(count) for p in range(producers)]


def test_every_message_once_in_order_is_ok() -> None:
    tally = _tally(_all())
    assert (tally.received, tally.duplicates, tally.reordered, tally.foreign) == (10, 0, 0, 0)
    for topic in (False, True):
        result = check([tally], topic=topic, producers=2, consumers=1, count=5)
        assert result.ok
        assert (result.expected, result.missing, result.duplicated) == (10, 0, 0)
        assert "arrived exactly once" in result.summary()


def test_missing_and_duplicated_are_counted() -> None:
    tally = _tally([(0, 0), (0, 1), (0, 1), (1, 4)])
    result = check([tally], topic=False, producers=2, consumers=1, count=5)
    assert not result.ok
    assert (result.missing, result.duplicated, result.received) == (7, 1, 4)
    assert "7 MISSING" in result.summary()
    assert "1 DUPLICATED" in result.summary()


def test_queue_union_over_consumers_and_overlaps() -> None:
    everything = _all()
    first, second = everything[::2], everything[1::2]
    split = check([_tally(first), _tally(second)], topic=False, producers=2, consumers=2, count=5)
    assert split.ok and split.missing == 0 and split.duplicated == 0
    # A message delivered to two consumers of a queue is a duplicate.
    overlap = check(
        [_tally(first), _tally([*second, (0, 0)])],
        topic=False,
        producers=2,
        consumers=2,
        count=5,
    )
    assert (overlap.missing, overlap.duplicated) == (0, 1)


def test_topic_needs_everything_at_every_consumer() -> None:
    result = check(
        [_tally(_all()), _tally(_all()[:-1])], topic=True, producers=2, consumers=2, count=5
    )
    assert (result.expected, result.missing) == (20, 1)
    # A consumer that never reported counts as having received nothing.
    absent = check([_tally(_all())], topic=True, producers=2, consumers=2, count=5)
    assert absent.missing == 10


def test_order_is_required_for_topics_only() -> None:
    tally = _tally([(0, 1), (0, 0), (0, 2), (0, 3), (0, 4)], producers=1)
    assert tally.reordered == 1
    queue = check([tally], topic=False, producers=1, consumers=1, count=5)
    topic = check([tally], topic=True, producers=1, consumers=1, count=5)
    assert queue.ok and "out of producer order" in queue.summary()
    assert not topic.ok and "1 OUT OF ORDER" in topic.summary()


def test_bodies_of_other_runs_or_shapes_are_foreign() -> None:
    tally = Tally(body_prefix(TOKEN), 1, 5)
    tally.add(
        [
            make_body(b"deadbeef", 0, 0, 40),  # another run
            make_body(TOKEN, 3, 0, 40),  # no such producer
            make_body(TOKEN, 0, 9, 40),  # beyond the count
            TOKEN + b":garbage",
            make_body(TOKEN, 0, 2, 40),
        ]
    )
    assert (tally.foreign, tally.received) == (4, 1)
    result = check([tally], topic=False, producers=1, consumers=1, count=5)
    assert result.missing == 4 and "4 messages of an earlier run ignored" in result.summary()
