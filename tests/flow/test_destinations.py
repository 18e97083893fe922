"""DestinationLimit: broker.max_destinations over every pipeline, and MemWatch's backstop."""

from __future__ import annotations

from mpbroker.errors import DestinationLimitReached, LimitReached
from mpbroker.flow import DestinationLimit


def limit_of(limit: int, held: list[int], others: int = 0) -> tuple[DestinationLimit, list[int]]:
    """A limit counting `held[0]` destinations here and `others` elsewhere; what it
    published, in order."""
    published: list[int] = []
    destinations = DestinationLimit(limit, others=lambda: others, publish=published.append)
    destinations.count_with(lambda: held[0])
    return destinations, published


def test_a_new_destination_within_the_limit_is_counted_first_then_allowed() -> None:
    destinations, published = limit_of(10, [4], others=5)
    assert destinations.refusal("/queue/new") is None
    assert published == [5]  # ours with the new one, before the others were read
    assert destinations.total() == 9
    assert destinations.refused == 0


def test_one_past_the_limit_over_every_pipeline_is_refused_and_taken_back() -> None:
    destinations, published = limit_of(10, [4], others=6)
    refusal = destinations.refusal("/topic/new", "SUBSCRIBE")
    assert isinstance(refusal, DestinationLimitReached)
    assert refusal.message == "ResourceAllocation: /topic/new broker.max_destinations 10 reached"
    assert refusal.detail.startswith("Nothing was subscribed: the broker holds 10 destinations")
    assert "broker.max_destinations" in refusal.detail and "memory.max_memory" in refusal.detail
    assert published == [5, 4]  # counted, then taken back
    assert destinations.refused == 1
    send = destinations.refusal("/queue/new")
    assert send is not None and send.detail.startswith("The message was not accepted")


def test_the_last_place_another_pipeline_is_taking_is_not_taken_twice() -> None:
    # 9 of 10 held (4 here, 5 there), and both make one more at the same moment: each
    # counts its own first, so the other sees it and refuses (both do, when both counted
    # before either read: early, never late).
    counters = [4, 5]
    first = DestinationLimit(10, others=lambda: counters[1])
    second = DestinationLimit(10, others=lambda: counters[0])
    first.count_with(lambda: 4)
    second.count_with(lambda: 5)
    first.publish = lambda n: counters.__setitem__(0, n)
    second.publish = lambda n: counters.__setitem__(1, n)
    counters[0] = 5  # the first has counted its new one and not read the other's yet
    assert second.refusal("/queue/b") is not None  # 6 + 5
    assert counters[1] == 5  # the second took its back
    assert first.refusal("/queue/a") is None  # now 5 + 5: the first's fits


def test_destinations_admitted_but_not_made_yet_count() -> None:
    destinations, _ = limit_of(3, [2])
    assert destinations.refusal("/queue/a") is None
    destinations.reserve("/queue/a")
    assert destinations.count == 3
    assert destinations.refusal("/queue/b") is not None
    destinations.made("/queue/a")
    assert destinations.count == 2


def test_memwatch_past_its_share_refuses_every_new_destination() -> None:
    destinations, _ = limit_of(1000, [1])
    destinations.refuse_permille = 950
    destinations.memory_permille = 949
    assert destinations.refusal("/queue/a") is None
    destinations.memory_permille = 962
    refusal = destinations.refusal("/queue/b")
    assert isinstance(refusal, LimitReached)
    assert refusal.message == (
        "ResourceAllocation: /queue/b refuse_destinations_percent 95 "
        "(memory at 96.2 % of max_memory) reached"
    )
    assert "memory.refuse_destinations_percent" in refusal.detail
    destinations.refuse_permille = 0  # never
    assert destinations.refusal("/queue/c") is None
