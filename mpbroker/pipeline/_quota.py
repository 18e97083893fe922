"""The quota waiting room of a p2p pipeline: SENDs that wait for room in their quota.

WebLogic's named quotas: a SEND whose destination's quota is full waits (at most its send
timeout), in the order the quota's policy gives (`QuotaBook`), while the gateways hold the
destination's other producers (a flow-control stop, store `quotas`); a message larger than
the quota could ever hold is refused at once. Messages leaving give room back: the engine's
effects name the tickets let in.

A Barrier (a COMMIT's or DISCONNECT's receipt) answers for every earlier frame of its
connection, so one that arrives while a SEND of that connection waits here waits too,
until those SENDs were let in or refused: a RECEIPT must not overtake a message that was
not yet stored (or not yet refused).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from mpbroker.engine import Outbox
from mpbroker.errors import LimitReached, NeverFits
from mpbroker.flow import QuotaBook
from mpbroker.records import Barrier, Refuse, Send, message_size

__all__ = ["QuotaWaitingRoom", "StopChange"]


@dataclass(frozen=True, slots=True)
class StopChange:
    """A destination's producers must stop (`reason`: the quota's limits) or may go ("")."""

    destination: str
    reason: str


class QuotaWaitingRoom:
    """SENDs waiting for room in their destination's quota, by ticket, in arrival order."""

    def __init__(
        self, quotas: QuotaBook, outbox: Outbox, send_timeout_ms: Callable[[str], int]
    ) -> None:
        self.quotas = quotas
        self.outbox = outbox
        self.send_timeout_ms = send_timeout_ms
        self._held: dict[int, tuple[int, Send, int]] = {}  # ticket -> gateway, SEND, deadline
        self._tickets = itertools.count(1)
        self._stops: dict[str, str] = {}  # destinations whose producers are held -> reason
        # Barriers waiting for earlier SENDs of their connection: gateway, Barrier, and the
        # last ticket given out when it came (later SENDs do not hold it).
        self._barriers: list[tuple[int, Barrier, int]] = []
        self._last_ticket = 0

    def holds_barrier(self, gateway: int, barrier: Barrier) -> bool:
        """Whether `barrier` must wait for a SEND of its connection waiting here (True: it
        is kept, and `step` gives it back once those SENDs are gone)."""
        if not any(g == gateway and r.conn == barrier.conn for g, r, _ in self._held.values()):
            return False
        self._barriers.append((gateway, barrier, self._last_ticket))
        return True

    def admit(self, gateway: int, record: Send, now_ms: int) -> bool:
        """Room for a SEND in its destination's quota: True if it may go on now; else it
        waits here (at most its send timeout) or, if it can never fit, is refused."""
        message = record.message
        message.size = message_size(message)
        destination = message.destination
        quotas = self.quotas
        if not quotas.fits_ever(destination, message.size):
            refusal = NeverFits(
                destination,
                quotas.describe(destination),
                message.size,
                "The message was not accepted.",
            )
            self.outbox.add(gateway, Refuse.of(record.conn, refusal, record.receipt))
            return False
        ticket = self._last_ticket = next(self._tickets)
        if quotas.request(ticket, destination, message.size):
            return True
        deadline = now_ms + self.send_timeout_ms(destination)
        self._held[ticket] = (gateway, record, deadline)
        return False

    def step(
        self, granted: list[int], now_ms: int
    ) -> tuple[list[tuple[int, Send | Barrier]], list[StopChange]]:
        """Let in the SENDs their quota has room for now (`granted`: the tickets room was
        given back for); refuse those whose send timeout passed. Returns the SENDs let in,
        in order, then the Barriers no longer waiting for any (the pipeline handles them
        now), and the destinations whose producers must now be stopped or may go again."""
        granted = list(granted)
        quotas = self.quotas
        for ticket, (gateway, record, deadline) in list(self._held.items()):
            if now_ms < deadline:
                continue
            del self._held[ticket]
            granted += quotas.cancel(ticket)
            destination = record.message.destination
            timeout = self.send_timeout_ms(destination)
            refusal = LimitReached(
                destination,
                quotas.describe(destination),
                detail=f"The message was not accepted: it waited send_timeout_ms {timeout} for "
                "room in the quota.",
            )
            self.outbox.add(gateway, Refuse.of(record.conn, refusal, record.receipt))
        admitted: list[tuple[int, Send | Barrier]] = []
        for ticket in granted:
            held = self._held.pop(ticket, None)
            if held is not None:
                admitted.append((held[0], held[1]))
        if self._barriers:
            admitted += self._released_barriers()
        waiting = {record.message.destination for _, record, _ in self._held.values()}
        changes = []
        for destination in waiting - self._stops.keys():
            reason = self._stops[destination] = quotas.describe(destination)
            changes.append(StopChange(destination, reason))
        for destination in self._stops.keys() - waiting:
            del self._stops[destination]
            changes.append(StopChange(destination, ""))
        return admitted, changes

    def _released_barriers(self) -> list[tuple[int, Barrier]]:
        released = []
        waiting = []
        for gateway, barrier, mark in self._barriers:
            if any(
                ticket <= mark and g == gateway and r.conn == barrier.conn
                for ticket, (g, r, _) in self._held.items()
            ):
                waiting.append((gateway, barrier, mark))
            else:
                released.append((gateway, barrier))
        self._barriers = waiting
        return released

    def stops(self) -> dict[str, str]:
        """The destinations whose producers are held now, and why."""
        return dict(self._stops)
