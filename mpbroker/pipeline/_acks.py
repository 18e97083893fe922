"""Answering ACKs and NACKs of stored messages once the store has written their effect.

A RECEIPT says the acknowledgement is done, so it goes only after the settlement (or the
delivery count of a NACK) is committed. When the store cannot write it (a full filesystem
with its reserve spent, an I/O error), the client hears an ERROR instead, which closes its
connection as every STOMP ERROR does; an acknowledged message goes back to the head of its
queue, redelivered, since it was not acknowledged after all. Everything else goes on.
"""

from __future__ import annotations

import logging

from mpbroker.engine import Outbox, QueueEngine, StoredAck
from mpbroker.logs import log_collapsed
from mpbroker.records import Receipt, Refuse
from mpbroker.stores import StoreError

__all__ = ["answer_stored_acks", "log_store_error"]

log = logging.getLogger("mpbroker.pipeline")

_DETAIL = {
    "ACK": "The acknowledgement was not stored: the message is unacknowledged and will be "
    "delivered again (redelivered).",
    "NACK": "The NACK was not stored: it applies in memory, but after a restart the message "
    "may be delivered again as if it had not been refused.",
}


def log_store_error(what: str, exc: StoreError) -> None:
    """One ERROR line per kind of write and 10 s while a store keeps failing (a full
    filesystem fails every step), with the count of the others."""
    log_collapsed(
        log, logging.ERROR, f"store error while {what}", "", "store error while %s: %s", what, exc
    )


def answer_stored_acks(
    engine: QueueEngine,
    outbox: Outbox,
    acks: list[StoredAck],
    failed: dict[str, StoreError],
) -> None:
    """RECEIPTs for `acks` (in order) whose frame kind is not in `failed`; for the others an
    ERROR naming the store error, and their acknowledged messages back in their queue."""
    for ack in acks:
        error = failed.get(ack.frame)
        if error is None:
            if ack.receipt:
                outbox.add(ack.gateway, Receipt(ack.conn, ack.receipt))
            continue
        if ack.frame == "ACK":
            engine.unsettle(ack.queue, ack.messages)
        outbox.add(
            ack.gateway,
            Refuse(
                ack.conn,
                f"{ack.frame} not stored: {error.client_text}",
                _DETAIL[ack.frame],
                ack.receipt,
            ),
        )
