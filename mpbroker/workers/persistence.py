"""Persistent queue messages in a p2p worker: stored before they count as sent.

A SEND with `persistent:true` waits in the small processing buffer (`CommitBuffer`) until
the first of its delay, count and byte limits, then the whole batch is written in one store
transaction (group commit); only then does the engine take the messages, so their RECEIPTs
follow the commit. Acknowledgements and returns are written back after every batch.
"""

from __future__ import annotations

import logging
import time

import msgspec

from mpbroker.config import Config
from mpbroker.engine import Outbox, QueueEngine
from mpbroker.records import Refuse, Send
from mpbroker.stores import CommitBuffer, MessageStore, StoreError

__all__ = ["QueuePersistence"]

log = logging.getLogger("mpbroker.pipeline")


def _now_ms() -> int:
    return int(time.time() * 1000)


class QueuePersistence:
    def __init__(
        self, store: MessageStore, engine: QueueEngine, outbox: Outbox, config: Config
    ) -> None:
        self.store = store
        self.engine = engine
        self.outbox = outbox
        commit = config.store
        self.buffer: CommitBuffer[tuple[int, Send]] = CommitBuffer(
            commit.commit_max_delay_ms,
            commit.commit_max_messages if commit.group_commit else 1,
            commit.commit_max_bytes,
        )

    def recover(self) -> int:
        """Put every unsettled stored message back in its queue; returns how many.

        They may have been delivered before the restart, so they are marked redelivered:
        at least once, and never a duplicate without `redelivered:true`.
        """
        restored = 0
        for stored in self.store.live():
            # Counted as delivered once more: it may have reached a consumer before.
            message = msgspec.structs.replace(
                stored.message,
                seq=stored.seq,
                deliveries=stored.deliveries + 1,
                redelivered=True,
            )
            self.engine.restore(message)
            restored += 1
        return restored

    def offer(self, gateway: int, record: Send) -> None:
        """A persistent SEND: admitted against the limits, then buffered for the store."""
        if not self.engine.admit(gateway, record):
            return
        if self.buffer.add((gateway, record), record.message.size, _now_ms()):
            self.commit()

    def commit(self) -> None:
        """Write what is buffered in one transaction, then let the engine have it."""
        batch = self.buffer.take()
        if not batch:
            return
        try:
            seqs = self.store.append([record.message for _, record in batch])
        except StoreError as exc:
            # Never acknowledge a message that was not stored: every sender hears why.
            log.error("store error, refusing %d messages: %s", len(batch), exc)
            for gateway, record in batch:
                self.outbox.add(
                    gateway,
                    Refuse(
                        record.conn,
                        f"store error: {exc}",
                        "The message was not stored.",
                        record.receipt,
                    ),
                )
            return
        for (gateway, record), seq in zip(batch, seqs, strict=True):
            record.message.seq = seq
            self.engine.handle(gateway, record)

    def due_in_s(self) -> float | None:
        """Seconds until the buffer's delay runs out (None if it is empty)."""
        due = self.buffer.due_in_ms(_now_ms())
        return None if due is None else due / 1000

    def commit_if_due(self) -> None:
        due = self.buffer.due_in_ms(_now_ms())
        if due is not None and due <= 0:
            self.commit()

    def write_back(self) -> None:
        """Record what the engine settled and returned since the last call."""
        engine = self.engine
        try:
            if engine.settled_seqs:
                self.store.settle(engine.settled_seqs, "acked", _now_ms())
            if engine.returned_seqs:
                self.store.record_delivery(engine.returned_seqs)
        except StoreError as exc:
            # The messages stay live in the store and come back after a restart, marked
            # redelivered: at least once, as promised for persistent messages.
            log.error("store error while recording acknowledgements: %s", exc)
        engine.settled_seqs.clear()
        engine.returned_seqs.clear()
