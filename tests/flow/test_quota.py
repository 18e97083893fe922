"""Quota: FIFO and preemptive service of waiting senders, limits, cancel."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpbroker.flow import NO_LIMIT, Quota, QuotaPolicy, QuotaSettings


def quota(
    policy: QuotaPolicy, max_messages: int = 10, max_bytes: int = 100, shared: bool = True
) -> Quota:
    return Quota(QuotaSettings("q1", max_messages, max_bytes, shared, policy))


@pytest.mark.parametrize("policy", list(QuotaPolicy))
def test_requests_that_fit_are_granted_and_counted(policy: QuotaPolicy) -> None:
    q = quota(policy)
    assert q.request(1, 4, 40)
    assert q.request(2, 6, 60)
    assert q.used == (10, 100)
    assert not q.request(3, 1, 0)  # messages full
    assert q.waiting == 1
    assert q.release(1, 10) == [3]
    assert q.used == (10, 90)
    assert q.waiting == 0


def test_fifo_a_new_request_waits_behind_waiting_ones_even_if_it_fits() -> None:
    q = quota(QuotaPolicy.FIFO)
    assert q.request(1, 1, 90)
    assert not q.request(2, 1, 50)
    assert not q.request(3, 1, 5)  # would fit, but 2 is first
    assert q.waiting == 2
    assert q.release(0, 30) == []  # 60 used: 2 (50) does not fit, and 3 stays behind it
    assert q.release(1, 60) == [2, 3]
    assert q.used == (2, 55)


def test_fifo_release_stops_at_the_first_that_does_not_fit() -> None:
    q = quota(QuotaPolicy.FIFO)
    assert q.request(1, 1, 100)
    for ticket, size in ((2, 10), (3, 85), (4, 10)):
        assert not q.request(ticket, 1, size)
    assert q.release(1, 100) == [2, 3]
    assert q.waiting == 1  # 4 (10) does not fit on top of 95
    assert q.release(1, 10) == [4]


def test_preemptive_grants_what_fits_even_while_others_wait() -> None:
    q = quota(QuotaPolicy.PREEMPTIVE)
    assert q.request(1, 1, 60)
    assert not q.request(2, 1, 50)
    assert q.request(3, 1, 40)  # fits: jumps the line
    assert q.used == (2, 100)
    assert not q.request(4, 1, 10)
    assert not q.request(5, 1, 30)
    assert q.release(1, 60) == [2, 4]  # 5 is skipped: 50+40+10 = 100 full
    assert q.waiting == 1


def test_preemptive_release_skips_larger_waiters() -> None:
    q = quota(QuotaPolicy.PREEMPTIVE, max_bytes=100)
    assert q.request(1, 1, 100)
    assert not q.request(2, 1, 80)
    assert not q.request(3, 1, 20)
    assert q.release(0, 30) == [3]
    assert q.release(0, 70) == [2]


def test_cancel_removes_a_waiter_and_lets_fifo_followers_through() -> None:
    q = quota(QuotaPolicy.FIFO)
    assert q.request(1, 1, 60)
    assert not q.request(2, 1, 90)
    assert not q.request(3, 1, 10)
    assert q.cancel(2) == [3]  # 3 fitted all along, only 2 held it back
    assert q.waiting == 0
    assert q.cancel(2) == []  # already gone: ignored
    assert q.cancel(99) == []
    assert q.release(2, 70) == []


def test_fits_ever_and_oversized_requests() -> None:
    q = quota(QuotaPolicy.FIFO, max_messages=5, max_bytes=100)
    assert q.fits_ever(5, 100)
    assert not q.fits_ever(6, 1)
    assert not q.fits_ever(1, 101)
    with pytest.raises(ValueError, match="max_bytes 100"):
        q.request(1, 1, 101)


def test_no_limit() -> None:
    q = quota(QuotaPolicy.FIFO, max_messages=NO_LIMIT, max_bytes=NO_LIMIT)
    assert q.fits_ever(10**9, 10**15)
    assert q.request(1, 10**9, 10**15)
    q2 = quota(QuotaPolicy.FIFO, max_messages=NO_LIMIT, max_bytes=10)
    assert q2.request(1, 1000, 10)
    assert not q2.request(2, 1, 1)


def test_release_clamps_at_zero() -> None:
    q = quota(QuotaPolicy.FIFO)
    q.request(1, 1, 10)
    assert q.release(5, 500) == []
    assert q.used == (0, 0)


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="max_messages -2"):
        QuotaSettings("q", -2, 10, False, QuotaPolicy.FIFO)
    q = quota(QuotaPolicy.FIFO)
    with pytest.raises(ValueError, match="negative"):
        q.request(1, -1, 0)
    with pytest.raises(ValueError, match="negative"):
        q.release(0, -1)
    q.request(1, 10, 0)
    q.request(2, 1, 0)
    with pytest.raises(ValueError, match="ticket 2"):
        q.request(2, 1, 0)


def test_settings_keep_shared_and_policy() -> None:
    q = quota(QuotaPolicy.PREEMPTIVE, shared=False)
    assert not q.settings.shared
    assert q.settings.policy is QuotaPolicy("preemptive")


# --- property tests ----------------------------------------------------------------------

operations = st.lists(
    st.tuples(
        st.sampled_from(["request", "request", "release", "cancel"]),
        st.integers(0, 4),
        st.integers(0, 40),
        st.integers(0, 10),  # which granted / waiting one to release or cancel
    ),
    max_size=80,
)


@settings(max_examples=300)
@given(
    st.sampled_from(list(QuotaPolicy)),
    st.one_of(st.just(NO_LIMIT), st.integers(4, 10)),
    st.one_of(st.just(NO_LIMIT), st.integers(40, 100)),
    operations,
)
def test_quota_invariants(
    policy: QuotaPolicy, max_messages: int, max_bytes: int, ops: list[tuple[str, int, int, int]]
) -> None:
    q = quota(policy, max_messages, max_bytes)
    sizes: dict[int, tuple[int, int]] = {}
    waiting: list[int] = []  # arrival order
    granted: list[int] = []  # not released yet
    grant_order: list[int] = []
    cancelled: set[int] = set()
    next_ticket = 0

    def granted_now(tickets: list[int]) -> None:
        for t in tickets:
            assert t in waiting and t not in cancelled
            waiting.remove(t)
        granted.extend(tickets)
        grant_order.extend(tickets)

    for op, m, b, pick in ops:
        if op == "request":
            next_ticket += 1
            sizes[next_ticket] = (m, b)
            fits_now = all(
                limit == NO_LIMIT or used + want <= limit
                for limit, used, want in zip((max_messages, max_bytes), q.used, (m, b), strict=True)
            )
            had_waiters = bool(waiting)
            if q.request(next_ticket, m, b):
                assert fits_now
                assert policy is QuotaPolicy.PREEMPTIVE or not had_waiters
                granted.append(next_ticket)
                grant_order.append(next_ticket)
            else:
                assert not fits_now or (policy is QuotaPolicy.FIFO and had_waiters)
                waiting.append(next_ticket)
        elif op == "release" and granted:
            ticket = granted.pop(pick % len(granted))
            granted_now(q.release(*sizes[ticket]))
        elif op == "cancel" and waiting:
            ticket = waiting[pick % len(waiting)]
            granted_now(q.cancel(ticket))
            if ticket in waiting:
                waiting.remove(ticket)
                cancelled.add(ticket)

        used = q.used
        assert used == (sum(sizes[t][0] for t in granted), sum(sizes[t][1] for t in granted))
        assert max_messages == NO_LIMIT or used[0] <= max_messages
        assert max_bytes == NO_LIMIT or used[1] <= max_bytes
        assert q.waiting == len(waiting)
        assert not cancelled & set(grant_order)
        if policy is QuotaPolicy.FIFO:
            # Tickets grow in arrival order: FIFO grants them in that order.
            assert grant_order == sorted(grant_order)
        else:
            # Nobody waits who would fit now.
            for t in waiting:
                assert not q.fits_ever(sizes[t][0] + used[0], sizes[t][1] + used[1])


def test_the_book_gives_shared_quotas_one_instance_and_the_others_one_per_destination() -> None:
    from mpbroker.config import config_from_mapping
    from mpbroker.flow import QuotaBook

    config = config_from_mapping(
        {
            "quotas": {
                "shared": {"max_messages": 2},
                "own": {"max_messages": 1, "shared": False},
                "default": {"max_messages": 1},
            },
            "destinations": {
                "/queue/s.*": {"quota": "shared"},
                "/queue/o.*": {"quota": "own"},
            },
        }
    )
    book = QuotaBook(config)
    assert book.request(1, "/queue/s.a", 10) and book.request(2, "/queue/s.b", 10)
    assert not book.request(3, "/queue/s.a", 10)  # the shared one is full
    assert book.request(4, "/queue/o.a", 10) and book.request(5, "/queue/o.b", 10)  # own each
    assert book.name("/queue/anything") == "default"
    assert book.describe("/queue/s.a") == "quota shared max_messages 2"
    assert book.release("/queue/s.b", 1, 10) == [3]  # room in the shared quota: 3 goes in
    assert not book.request(6, "/queue/o.a", 10)
    assert book.cancel(6) == [] and book.release("/queue/o.a", 1, 10) == []
