"""The replay budget: places, batch limits, bytes in flight."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mpbroker.engine import ReplayScheduler
from mpbroker.records import ReplayRequest


def req(name: str, partition: int = 1, after: int = 0, request_id: int = 1) -> ReplayRequest:
    return ReplayRequest(partition, name, request_id, [after] * 10)


def scheduler(concurrent: int = 4, global_bytes: int = 1000, batch_bytes: int = 300):
    return ReplayScheduler(concurrent, global_bytes, 100, batch_bytes)


def test_a_request_gets_a_grant_with_the_batch_limits() -> None:
    s = scheduler()
    s.request(req("a"))
    grant = s.next_grant()
    assert grant is not None
    assert (grant.request.name, grant.max_messages, grant.max_bytes) == ("a", 100, 300)
    assert grant.at_least_one
    s.sent(grant, 250, fitted=True)
    assert s.next_grant() is None  # served: waits for the owner's next request
    assert s.in_flight_bytes == 250


def test_the_next_request_lands_the_previous_batch() -> None:
    s = scheduler()
    s.request(req("a"))
    grant = s.next_grant()
    assert grant is not None
    s.sent(grant, 250, fitted=True)
    s.request(req("a", after=10, request_id=2))
    assert s.in_flight_bytes == 0
    grant = s.next_grant()
    assert grant is not None and grant.request.after == [10] * 10


def test_at_most_max_concurrent_subscriptions_replay_the_rest_wait_in_order() -> None:
    s = scheduler(concurrent=2)
    for name in "abcd":
        s.request(req(name))
    served = []
    while (grant := s.next_grant()) is not None:
        served.append(grant.request.name)
        s.sent(grant, 10, fitted=True)
    assert served == ["a", "b"]
    s.request(req("a", request_id=2))  # a keeps its place while it replays
    grant = s.next_grant()
    assert grant is not None and grant.request.name == "a"
    s.sent(grant, 10, fitted=True)
    s.release(1, "b")  # b caught up: c gets its place
    grant = s.next_grant()
    assert grant is not None and grant.request.name == "c"


def test_bytes_in_flight_never_pass_the_global_budget() -> None:
    s = scheduler(concurrent=10, global_bytes=500, batch_bytes=300)
    for name in "abc":
        s.request(req(name))
    g1 = s.next_grant()
    assert g1 is not None and g1.max_bytes == 300
    s.sent(g1, 300, fitted=True)
    g2 = s.next_grant()
    assert g2 is not None and g2.max_bytes == 200 and not g2.at_least_one
    s.sent(g2, 200, fitted=True)
    assert s.next_grant() is None  # 500 in flight
    s.release(1, g1.request.name)
    g3 = s.next_grant()
    assert g3 is not None and g3.max_bytes == 300


def test_a_message_larger_than_the_budget_goes_alone_once_nothing_is_in_flight() -> None:
    s = scheduler(concurrent=10, global_bytes=500, batch_bytes=300)
    s.request(req("small"))
    s.request(req("big"))
    g = s.next_grant()
    assert g is not None and g.request.name == "small"
    s.sent(g, 100, fitted=True)
    g = s.next_grant()
    assert g is not None and g.request.name == "big" and not g.at_least_one
    s.sent(g, 0, fitted=False)  # its 2000-byte message did not fit in 300
    assert s.next_grant() is None
    s.release(1, "small")
    g = s.next_grant()
    assert g is not None and g.request.name == "big" and g.at_least_one
    s.sent(g, 2000, fitted=True)
    assert s.in_flight_bytes == 2000


def test_releasing_a_partition_frees_every_place_it_held() -> None:
    s = scheduler(concurrent=2)
    s.request(req("a", partition=1))
    s.request(req("b", partition=1))
    s.request(req("c", partition=2))
    for _ in range(2):
        g = s.next_grant()
        assert g is not None
        s.sent(g, 100, fitted=True)
    s.release(1)
    assert s.in_flight_bytes == 0
    g = s.next_grant()
    assert g is not None and g.request.partition == 2


def test_a_newer_request_replaces_an_older_one_for_the_same_subscription() -> None:
    s = scheduler()
    s.request(req("a", request_id=1))
    s.request(req("a", request_id=2, after=5))
    g = s.next_grant()
    assert g is not None and (g.request.request_id, g.request.after) == (2, [5] * 10)
    s.sent(g, 1, fitted=True)
    assert s.next_grant() is None


@settings(max_examples=200)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["request", "release", "serve"]),
            st.sampled_from(["a", "b", "c", "d", "e"]),
            st.integers(min_value=0, max_value=900),
        ),
        max_size=60,
    )
)
def test_budget_invariants_hold_for_any_sequence(ops: list[tuple[str, str, int]]) -> None:
    limit, concurrent = 1000, 2
    s = ReplayScheduler(concurrent, limit, 100, 400)
    for op, name, size in ops:
        if op == "request":
            s.request(req(name))
        elif op == "release":
            s.release(1, name)
        else:
            grant = s.next_grant()
            if grant is not None:
                fits = size <= grant.max_bytes or grant.at_least_one
                s.sent(grant, size if fits else 0, fitted=fits)
        assert len(s.places) <= concurrent
        assert s.in_flight_bytes == sum(s.in_flight.values())
        # Over the budget only through a single message granted with nothing in flight.
        assert s.in_flight_bytes <= limit or len(s.in_flight) == 1
        assert set(s.places).isdisjoint(s.waiting)
