"""TransactionBudget and pick_victims: a gateway's transaction memory, its limits, and which
open transactions each `transactions.reduce_strategy` discards (pure, no sessions)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpbroker.config import Config, TransactionSettings, replace_settings
from mpbroker.errors import LimitReached
from mpbroker.session import (
    OpenTransaction,
    ReduceStrategy,
    TransactionBudget,
    pick_victims,
)

S = ReduceStrategy


def tx(conn: int, name: str, seq: int, held: int, messages: int = 1) -> OpenTransaction:
    return OpenTransaction(
        conn, name, opened_ms=1000 + seq, seq=seq, held_bytes=held, messages=messages
    )


# Four connections' open transactions, in BEGIN order (seq):
#   conn 1: a (seq 0, 10 bytes in 5 messages)
#   conn 2: b (seq 1, 40 bytes in 1 message), e (seq 4, 0 bytes: only ACKs)
#   conn 3: c (seq 2, 25 bytes in 2 messages)
#   conn 4: d (seq 3, 30 bytes in 5 messages)
A, B, C, D, E = (
    tx(1, "a", 0, 10, 5),
    tx(2, "b", 1, 40, 1),
    tx(3, "c", 2, 25, 2),
    tx(4, "d", 3, 30, 5),
    tx(2, "e", 4, 0, 0),
)
OPEN = [A, B, C, D, E]


def names(victims: list[OpenTransaction] | None) -> list[str] | None:
    return None if victims is None else [v.name for v in victims]


@pytest.mark.parametrize(
    ("strategy", "need", "picked"),
    [
        # The most bytes first: b alone frees 40.
        (S.MAX_BYTES, 40, ["b"]),
        (S.MAX_BYTES, 41, ["b", "d"]),
        # The most messages first; a tie (a and d: 5) goes to the most bytes.
        (S.MAX_MESSAGES, 30, ["d"]),
        (S.MAX_MESSAGES, 31, ["d", "a"]),
        # BEGIN order; e (youngest) holds nothing and is passed over, but b's pick frees
        # e's connection too.
        (S.OLDEST_TX, 10, ["a"]),
        (S.OLDEST_TX, 11, ["a", "b"]),
        (S.YOUNGEST_TX, 30, ["d"]),
        (S.YOUNGEST_TX, 31, ["d", "c"]),
        (S.YOUNGEST_TX, 56, ["d", "c", "b"]),
        # Every connection, each named by its oldest transaction, however little is needed.
        (S.ALL, 1, ["a", "b", "c", "d"]),
        (S.NONE, 1, None),
    ],
)
def test_each_strategy_picks_one_transaction_at_a_time_until_enough_is_free(
    strategy: ReduceStrategy, need: int, picked: list[str] | None
) -> None:
    assert names(pick_victims(strategy, OPEN, need)) == picked


@pytest.mark.parametrize("strategy", [s for s in S if s is not S.NONE])
def test_nothing_is_picked_when_every_candidate_together_frees_too_little(
    strategy: ReduceStrategy,
) -> None:
    assert pick_victims(strategy, OPEN, 106) is None
    assert names(pick_victims(strategy, OPEN, 105)) is not None
    assert pick_victims(strategy, [], 1) is None


def test_a_pick_frees_its_whole_connection_which_is_not_picked_again() -> None:
    # Conn 1 holds 30 in two transactions: picking its largest frees both.
    two = [tx(1, "x", 0, 20), tx(1, "y", 1, 10), tx(2, "z", 2, 15)]
    assert names(pick_victims(S.MAX_BYTES, two, 30)) == ["x"]
    assert names(pick_victims(S.MAX_BYTES, two, 31)) == ["x", "z"]
    assert names(pick_victims(S.YOUNGEST_TX, two, 16)) == ["z", "y"]


def test_the_setting_names_every_strategy() -> None:
    [field] = [f for f in dataclasses.fields(TransactionSettings) if f.name == "reduce_strategy"]
    assert {ReduceStrategy(c) for c in field.metadata["choices"]} == set(ReduceStrategy)
    assert ReduceStrategy(TransactionSettings().reduce_strategy) is S.MAX_BYTES


# -- the budget ------------------------------------------------------------------------------


def budget(
    limit: int = 100, strategy: ReduceStrategy = S.MAX_BYTES, **kwargs: int
) -> TransactionBudget:
    return TransactionBudget(limit, strategy=strategy, **kwargs)


def fill(b: TransactionBudget, conn: int, name: str, *sizes: int, at: int = 0) -> None:
    b.begin(conn, name, at)
    for size in sizes:
        b.hold(conn, name, size)


def test_sends_within_the_limits_are_counted_per_connection_and_in_total() -> None:
    b = budget()
    fill(b, 1, "a", 10, 20)
    fill(b, 2, "b", 30)
    assert (b.used, b.held_by(1), b.held_by(2)) == (60, 30, 30)
    b.end(1, "a")
    assert (b.used, b.held_by(1)) == (30, 0)
    b.end_connection(2)
    b.end_connection(2)  # idempotent
    assert b.used == 0 and b.open_transactions() == []


@pytest.mark.parametrize(
    ("strategy", "discarded"),
    [
        (S.MAX_BYTES, [2]),
        (S.MAX_MESSAGES, [3]),
        (S.OLDEST_TX, [2]),
        (S.YOUNGEST_TX, [4]),
        (S.ALL, [2, 3, 4]),
    ],
)
def test_a_send_past_the_total_discards_what_the_strategy_picks_then_goes_in(
    strategy: ReduceStrategy, discarded: list[int]
) -> None:
    b = budget(strategy=strategy)
    fill(b, 1, "mine", 10)
    fill(b, 2, "big", 50)
    fill(b, 3, "many", 5, 5, 5, 5)
    fill(b, 4, "young", 15)
    assert b.used == 95

    b.hold(1, "mine", 20)  # 20 more would make 115: 15 must go

    assert b.take_to_tell() == discarded
    assert b.take_to_tell() == []
    assert b.held_by(1) == 30  # the sender is never a victim, with `all` neither
    for conn in discarded:
        assert b.held_by(conn) == 0
        found = b.take_discarded(conn)
        assert found is not None
        assert b.take_discarded(conn) is None  # taken once
        assert found.error.limit == "max_uncommitted_bytes"
        assert found.error.message == (
            "ResourceAllocation: transactions max_uncommitted_bytes 100 reached: "
            f"transaction {found.transaction!r} discarded by reduce_strategy {strategy.value}"
        )
        assert "nothing of it is delivered" in found.error.detail
    freed = {2: 50, 3: 20, 4: 15}
    assert b.used == 115 - sum(freed[conn] for conn in discarded)
    assert (b.discarded_for_room, b.discarded_for_age) == (len(discarded), 0)
    assert b.used == sum(t.held_bytes for t in b.open_transactions())
    assert b.used <= b.limit


def test_strategy_none_refuses_the_send_and_discards_nothing() -> None:
    b = budget(strategy=S.NONE)
    fill(b, 1, "mine", 10)
    fill(b, 2, "big", 85)
    with pytest.raises(LimitReached) as info:
        b.hold(1, "mine", 6)
    assert (
        info.value.message == "ResourceAllocation: transactions max_uncommitted_bytes 100 reached"
    )
    assert "to 101 bytes (reduce_strategy none)" in info.value.detail
    assert b.take_to_tell() == [] and b.used == 95 and b.held_by(1) == 10


def test_a_send_past_its_connections_limit_is_refused_whatever_the_strategy() -> None:
    b = budget(per_connection=40, strategy=S.ALL)
    fill(b, 1, "mine", 30)
    fill(b, 2, "other", 40)
    with pytest.raises(LimitReached) as info:
        b.hold(1, "mine", 11)
    assert info.value.message == (
        "ResourceAllocation: transactions max_uncommitted_bytes_per_connection 40 reached"
    )
    assert "nothing was discarded" in info.value.detail
    assert b.take_to_tell() == [] and b.used == 70


def test_a_message_larger_than_the_total_can_never_fit_and_is_refused() -> None:
    b = budget()  # per connection: up to the total, which is what a refusal then names
    fill(b, 2, "other", 50)
    b.begin(1, "mine", 0)
    with pytest.raises(LimitReached) as info:
        b.hold(1, "mine", 101)
    assert (
        info.value.message == "ResourceAllocation: transactions max_uncommitted_bytes 100 reached"
    )
    assert b.take_to_tell() == [] and b.used == 50


def test_one_connection_may_still_use_the_whole_total_by_default() -> None:
    b = budget()
    fill(b, 1, "a", 60)
    fill(b, 1, "b", 40)
    assert b.used == 100 and b.take_to_tell() == []


def test_a_victims_other_transactions_go_with_it_and_the_error_says_so() -> None:
    b = budget()
    fill(b, 2, "big", 70)
    fill(b, 2, "small", 10)
    fill(b, 1, "mine", 15)
    b.hold(1, "mine", 10)  # 105: big's pick frees 80
    assert b.used == 25
    found = b.take_discarded(2)
    assert found is not None
    assert (found.transaction, found.others) == ("big", ("small",))
    assert "other open transactions ('small') were rolled back with it" in found.error.detail


def test_transactions_open_longer_than_the_timeout_are_discarded() -> None:
    b = budget(timeout_ms=1000)
    fill(b, 1, "old", 10, at=0)
    fill(b, 2, "new", 10, at=500)
    fill(b, 1, "also-old", 5, at=600)
    b.expire(1000)
    assert b.take_to_tell() == []
    b.expire(1001)
    assert b.take_to_tell() == [1]
    found = b.take_discarded(1)
    assert found is not None
    assert found.error.message == (
        "ResourceAllocation: transactions timeout_ms 1000 reached: "
        "transaction 'old' rolled back after 1001 ms open"
    )
    assert found.others == ("also-old",)
    assert b.used == 10
    b.expire(1501)
    assert b.take_to_tell() == [2] and b.used == 0


def test_no_timeout_by_default() -> None:
    b = budget()
    fill(b, 1, "old", 10, at=0)
    b.expire(10**12)
    assert b.take_to_tell() == [] and b.used == 10


def test_a_connection_that_ends_is_owed_nothing() -> None:
    b = budget()
    fill(b, 2, "big", 90)
    fill(b, 1, "mine", 20)
    assert b.take_to_tell() == [2]
    b.end_connection(2)
    assert b.take_discarded(2) is None


def test_the_budget_is_made_from_the_settings() -> None:
    settings = replace_settings(
        Config(),
        "transactions",
        max_uncommitted_bytes=1000,
        max_uncommitted_bytes_per_connection=300,
        reduce_strategy="youngest_tx",
        timeout_ms=250,
    ).transactions
    b = TransactionBudget.from_settings(settings)
    assert (b.limit, b.per_connection, b.strategy, b.timeout_ms) == (1000, 300, S.YOUNGEST_TX, 250)
    default = TransactionBudget.from_settings(TransactionSettings())
    assert (default.per_connection, default.strategy) == (2 * 1024 * 1024, S.MAX_BYTES)


@pytest.mark.parametrize(("limit", "per_connection"), [(0, -1), (100, 0), (100, 101)])
def test_a_budget_against_its_own_limits_is_a_bug(limit: int, per_connection: int) -> None:
    with pytest.raises(ValueError, match="per connection"):
        TransactionBudget(limit, per_connection=per_connection)


# -- the invariants, under any traffic -------------------------------------------------------

_OPS = st.lists(
    st.tuples(
        st.sampled_from(["begin", "hold", "end", "close", "expire"]),
        st.integers(1, 4),  # connection
        st.sampled_from(["t1", "t2"]),
        st.integers(1, 60),  # bytes, or ms the clock moves
    ),
    max_size=60,
)


@given(strategy=st.sampled_from(list(S)), per_connection=st.sampled_from([-1, 50]), ops=_OPS)
def test_the_limits_always_hold_and_the_books_always_balance(
    strategy: ReduceStrategy, per_connection: int, ops: list[tuple[str, int, str, int]]
) -> None:
    b = TransactionBudget(100, per_connection=per_connection, strategy=strategy, timeout_ms=200)
    # What each connection's session knows to be open (the budget may have dropped them).
    sessions: dict[int, set[str]] = {}
    now = 0
    for op, conn, name, n in ops:
        if b.take_discarded(conn) is not None:
            sessions.pop(conn, None)  # its session says so: ERROR, closed
            b.end_connection(conn)
            continue
        open_here = sessions.setdefault(conn, set())
        if op == "begin" and name not in open_here:
            open_here.add(name)
            b.begin(conn, name, now)
        elif op == "hold" and name in open_here:
            before = b.held_by(conn)
            try:
                b.hold(conn, name, n)
            except LimitReached:
                # Refused only when it could not fit: past its own limit, or `none`.
                assert before + n > b.per_connection or (
                    strategy is S.NONE and b.used + n > b.limit
                )
            else:
                assert b.held_by(conn) == before + n  # the sender lost nothing
        elif op == "end" and name in open_here:
            open_here.discard(name)
            b.end(conn, name)
        elif op == "close":
            sessions.pop(conn, None)
            b.end_connection(conn)
        elif op == "expire":
            now += n
            b.expire(now)
        assert 0 <= b.used <= b.limit
        assert b.used == sum(t.held_bytes for t in b.open_transactions())
        for c in {t.conn for t in b.open_transactions()}:
            assert b.held_by(c) <= b.per_connection
        if op == "expire":
            assert all(now - t.opened_ms <= 200 for t in b.open_transactions())
