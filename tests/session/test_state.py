"""The session's transition table: every allowed transition, and every other one refused."""

from __future__ import annotations

import itertools

import pytest

from mpbroker.session import Event, SessionState, SessionStateError
from mpbroker.session._state import READING, TRANSITIONS, WRITING, transition

S, E = SessionState, Event

ALLOWED = {
    (S.AWAITING_CONNECT, E.CONNECT): S.CONNECTED,
    (S.AWAITING_CONNECT, E.ERROR): S.CLOSING,
    (S.AWAITING_CONNECT, E.CLOSED): S.CLOSED,
    (S.CONNECTED, E.DISCONNECT): S.CLOSING,
    (S.CONNECTED, E.DISCONNECT_RECEIPTED): S.DISCONNECTING,
    (S.CONNECTED, E.ERROR): S.CLOSING,
    (S.CONNECTED, E.CLOSED): S.CLOSED,
    (S.DISCONNECTING, E.RECEIPTS_ANSWERED): S.CLOSING,
    (S.DISCONNECTING, E.ERROR): S.CLOSING,
    (S.DISCONNECTING, E.CLOSED): S.CLOSED,
    (S.CLOSING, E.CLOSED): S.CLOSED,
}


@pytest.mark.parametrize(("state", "event"), list(itertools.product(S, E)))
def test_each_state_and_event_leads_where_the_table_says_or_is_refused(
    state: SessionState, event: Event
) -> None:
    expected = ALLOWED.get((state, event))
    if expected is not None:
        assert transition(state, event) is expected
        return
    with pytest.raises(SessionStateError) as info:
        transition(state, event)
    assert info.value.state is state and info.value.event is event
    assert str(info.value) == f"{event.value} is not allowed in state {state.value}"


def test_the_table_is_the_one_tested() -> None:
    assert TRANSITIONS == ALLOWED


def test_every_state_can_end_and_closed_is_final() -> None:
    for state in S:
        if state is not S.CLOSED:
            assert transition(state, E.CLOSED) is S.CLOSED
    assert not [event for (state, event) in TRANSITIONS if state is S.CLOSED]


def test_frames_are_read_before_disconnect_and_written_until_closing() -> None:
    assert frozenset({S.AWAITING_CONNECT, S.CONNECTED}) == READING
    assert frozenset({S.CONNECTED, S.DISCONNECTING}) == WRITING
