"""Answering ACKs and NACKs of stored messages once the store has written their effect.

A RECEIPT says the acknowledgement is done, so it goes only after the settlement (or the
delivery count of a NACK) is committed. When the store cannot write it (a full filesystem
with its reserve spent, an I/O error), the client hears an ERROR instead, which closes its
connection as every STOMP ERROR does; an acknowledged message goes back to the head of its
queue, redelivered, since it was not acknowledged after all. Neither that return nor those
of the connection the ERROR ends count against `max_redeliveries`: the broker failed, not
the consumer. Everything else goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from mpbroker.engine import Outbox, QueueEngine, StoredAck
from mpbroker.logs import log_collapsed
from mpbroker.records import Receipt, Refuse
from mpbroker.stores import StoreError

__all__ = ["CountRetry", "WriteFailures", "answer_stored_acks", "log_store_error"]

log = logging.getLogger("mpbroker.pipeline")

_DETAIL = {
    "ACK": "The acknowledgement was not stored: the message is unacknowledged and will be "
    "delivered again (redelivered).",
    "NACK": "The NACK was not stored: it applies in memory, and its delivery count is "
    "written once the store can take it.",
}


def log_store_error(what: str, exc: StoreError) -> None:
    """One ERROR line per kind of write and 10 s while a store keeps failing (a full
    filesystem fails every step), with the count of the others."""
    log_collapsed(
        log, logging.ERROR, f"store error while {what}", "", "store error while %s: %s", what, exc
    )


class KeepsCounts(Protocol):
    """A store that keeps in memory the delivery counts the filesystem did not take."""

    @property
    def unwritten_deliveries(self) -> int: ...

    def write_delivery_counts(self) -> None: ...


class CountRetry:
    """Delivery counts a store kept in memory (a full disk) are written again once a second
    at most, while there are any."""

    def __init__(self) -> None:
        self.next_ms = 0

    def step(self, store: KeepsCounts, now_ms: int) -> None:
        if store.unwritten_deliveries and now_ms >= self.next_ms:
            try:
                store.write_delivery_counts()
            except StoreError as exc:
                log_store_error("writing delivery counts kept in memory (retried in a second)", exc)
                self.next_ms = now_ms + 1000


class WriteFailures:
    """What a write-back could not store, by message: the store error per seq, and the
    seqs whose settlement failed (those are put back when their ACK is refused)."""

    def __init__(self) -> None:
        self.errors: dict[int, StoreError] = {}
        self.unsettled: set[int] = set()

    def failed(self, seqs: Iterable[int], exc: StoreError, *, settle: bool) -> None:
        for seq in seqs:
            self.errors[seq] = exc
            if settle:
                self.unsettled.add(seq)


def answer_stored_acks(
    engine: QueueEngine,
    outbox: Outbox,
    acks: list[StoredAck],
    failures: WriteFailures,
    takes_back: Callable[[str], bool] | None = None,
) -> None:
    """RECEIPTs for `acks` (in order) whose messages were all written; for the others an
    ERROR naming the store error, and their messages whose settlement failed back in
    their queue, unless `takes_back` says the queue no longer wants them (a durable
    subscription gone inactive: they stay in the store and are replayed)."""
    errors = failures.errors
    for ack in acks:
        error = next((errors[m.seq] for m in ack.messages if m.seq in errors), None)
        if error is None:
            if ack.receipt:
                outbox.add(ack.gateway, Receipt(ack.conn, ack.receipt))
            continue
        back = [m for m in ack.messages if m.seq in failures.unsettled]
        if back and (takes_back is None or takes_back(ack.queue)):
            engine.unsettle(ack.queue, back)
        # The ERROR ends the connection; what its consumers leave comes back uncounted.
        engine.closing_for_broker_failure(ack.gateway, ack.conn)
        outbox.add(
            ack.gateway,
            Refuse(
                ack.conn,
                f"{ack.frame} not stored: {error.client_text}",
                _DETAIL[ack.frame],
                ack.receipt,
            ),
        )
