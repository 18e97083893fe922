"""Persistent queue messages in a p2p worker: stored before they count as sent.

A SEND with `persistent:true` waits in the small processing buffer (`CommitBuffer`) until
the first of its delay, count and byte limits, then the whole batch is written in one store
transaction (group commit); only then does the engine take the messages, so their RECEIPTs
follow the commit. Acknowledgements and returns are written back after every batch.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Final

import msgspec

from mpbroker.clock import epoch_ms
from mpbroker.config import Config
from mpbroker.engine import IndexCache, Outbox, QueueEffects, QueueEngine
from mpbroker.errors import LimitReached
from mpbroker.records import Message, Refuse, Send
from mpbroker.stores import CommitBuffer, DiskLimitReached, MessageStore, StoreError

from ._acks import CountRetry, WriteFailures, answer_stored_acks, log_store_error

__all__ = ["QueuePersistence", "index_cache", "refuse_unstored"]

log = logging.getLogger("mpbroker.pipeline")


def refuse_unstored(outbox: Outbox, batch: Sequence[tuple[int, Send]], exc: StoreError) -> None:
    """A batch the store could not take: every sender hears why (a message that was not
    stored is never acknowledged). One the disk free limit refused is told so by name, as
    a SEND that flow control held is."""
    if isinstance(exc, DiskLimitReached):
        log.warning("refusing %d persistent messages: %s", len(batch), exc)
        for gateway, record in batch:
            refusal = LimitReached(
                record.message.destination,
                "disk_free_limit",
                exc.limit,
                detail="The message was not stored: it could have taken its store's "
                "filesystem below store.disk_free_limit_bytes.",
            )
            outbox.add(gateway, Refuse.of(record.conn, refusal, record.receipt))
        return
    log.error("store error, refusing %d messages: %s", len(batch), exc)
    for gateway, record in batch:
        outbox.add(
            gateway,
            Refuse(record.conn, exc.client_text, "The message was not stored.", record.receipt),
        )


# Paged messages read back with the one being delivered (MessageStore.read_ahead), and the
# most body bytes those may hold together: the read-ahead is outside the index cache's
# accounting, so it stays small.
READ_AHEAD_MESSAGES: Final = 64
READ_AHEAD_BYTES: Final = 256 * 1024


def index_cache(store: MessageStore, config: Config) -> IndexCache:
    """Waiting messages beyond the index cache keep only their index entry in memory; the
    store gives the rest back at delivery, reading ahead: a queue delivers its backlog in
    seq order, so the next messages are read with the first, and one query serves many
    deliveries. What was read ahead is dropped at the first message asked for that was not."""
    ahead: dict[int, Message] = {}

    def load(seq: int) -> Message:
        message = ahead.pop(seq, None)
        if message is not None:
            return message
        ahead.clear()
        first, *rest = store.read_ahead(seq, READ_AHEAD_MESSAGES, READ_AHEAD_BYTES)
        for stored in rest:
            ahead[stored.seq] = stored.message
        return first.message

    settings = config.store
    return IndexCache(load, settings.index_cache_entries, settings.index_cache_bytes)


class QueuePersistence:
    """Persistent queue messages of one p2p worker: group commit into its store, then the
    engine takes them; what the engine settled, returned and let expire, written back."""

    def __init__(
        self, store: MessageStore, engine: QueueEngine, outbox: Outbox, config: Config
    ) -> None:
        self.store = store
        self.engine = engine
        self.outbox = outbox
        commit = config.store
        self.cleanup_batch = commit.cleanup_batch
        self.cleanup_gap_ms = commit.cleanup_gap_ms
        # Expired messages still to be settled in the store, a batch per cleanup_gap_ms.
        self.expired_backlog: list[int] = []
        self.next_cleanup_ms = 0
        self.count_retry = CountRetry()
        self.buffer: CommitBuffer[tuple[int, Send]] = CommitBuffer.for_settings(commit)

    def recover(self) -> int:
        """Put every unsettled stored message back in its queue; returns how many.

        After a crash any of them may have been delivered before the restart, so all are
        marked redelivered: at least once, and never a duplicate without
        `redelivered:true`. After a clean stop (`stop_cleanly`) the store's delivery counts
        are complete: only the messages delivered before are marked.
        """
        clean = self.store.stopped_cleanly
        restored = 0
        # Only the first index_cache_entries come with their bodies: a restart with a
        # large backlog does not read every body into memory.
        cache = self.engine.index_cache
        for stored in self.store.live(full=cache.max_entries if cache is not None else None):
            # After a crash, counted as delivered once more: it may have reached a consumer.
            deliveries = stored.deliveries if clean else stored.deliveries + 1
            # A message the broker's own failure brought back has a delivery row counting 0.
            redelivered = stored.message.redelivered or deliveries > 0
            message = msgspec.structs.replace(
                stored.message, seq=stored.seq, deliveries=deliveries, redelivered=redelivered
            )
            self.engine.restore(message)
            restored += 1
        return restored

    def stop_cleanly(self) -> None:
        """The worker stops in order: what is in consumers' windows may have reached a
        client, so it counts as delivered; then the store is marked (see `recover`). If the
        store cannot record it, it is not marked: the next start flags every message."""
        in_windows = [seq for _, seq in self.engine.stored_in_windows()]
        try:
            if in_windows:
                self.store.record_delivery(in_windows)
            self.store.mark_clean_stop()
        except StoreError as exc:
            log.error("store error while stopping (the next start flags every message): %s", exc)

    def offer(self, gateway: int, record: Send) -> None:
        """A persistent SEND: admitted against the limits, then buffered for the store."""
        if not self.engine.admit(gateway, record):
            return
        if self.buffer.add((gateway, record), record.message.size, epoch_ms()):
            self.commit()

    def commit(self) -> None:
        """Write what is buffered in one transaction, then let the engine have it."""
        batch = self.buffer.take()
        if not batch:
            return
        try:
            seqs = self.store.append([record.message for _, record in batch])
        except StoreError as exc:
            refuse_unstored(self.outbox, batch, exc)
            return
        for (gateway, record), seq in zip(batch, seqs, strict=True):
            record.message.seq = seq
            self.engine.handle(gateway, record)

    def due_in_s(self) -> float | None:
        """Seconds until there is store work to do: the commit buffer's delay runs out, or
        the next cleanup batch is allowed (None if there is nothing waiting)."""
        now = epoch_ms()
        dues = [self.buffer.due_in_ms(now)]
        if self.expired_backlog:
            dues.append(max(0, self.next_cleanup_ms - now))
        known = [d for d in dues if d is not None]
        return min(known) / 1000 if known else None

    def commit_if_due(self) -> None:
        due = self.buffer.due_in_ms(epoch_ms())
        if due is not None and due <= 0:
            self.commit()

    def _move_dead_letters(self, moves: list[tuple[Message, Message, str]], now: int) -> None:
        """Store the dead-letter copies, then settle their originals.

        In that order: a crash in between leaves a duplicate (at least once), never a loss.
        If the copies cannot be stored, the originals go back to their queue, as stored
        (the move is tried again when they next come back or expire), and the StoreError is
        raised: a dead letter that is not on disk is never delivered, so no ACK of it can
        be answered with a RECEIPT.
        """
        engine = self.engine
        copies = [copy for _, copy, _ in moves]
        try:
            seqs = self.store.append(copies)
        except StoreError:
            engine.unmove([original for original, _, _ in moves])
            raise
        for copy, seq in zip(copies, seqs, strict=True):
            copy.seq = seq
        engine.enqueue_dead_letters(copies)
        # A dead letter's last delivery came back too (the NACK or the return that sent it
        # there): counted, so the store's count is the one its dead-letter reason names.
        returned = [m.seq for m, _, outcome in moves if outcome == "dead-lettered"]
        if returned:
            self.store.record_delivery(returned)
        for outcome in {outcome for _, _, outcome in moves}:
            seqs = [m.seq for m, _, o in moves if o == outcome]
            self.store.settle(seqs, outcome, now)

    def write_back(self, effects: QueueEffects) -> None:
        """Record what the engine settled, returned and expired in a step, then answer the
        ACKs and NACKs of stored messages: a RECEIPT once written, else an ERROR.

        What is not written stays live in the store and comes back after a restart, marked
        redelivered: at least once, as promised for persistent messages.
        Expired messages are settled in transactions of at most `cleanup_batch`, with
        `cleanup_gap_ms` between them, so a mass expiry never stalls delivery.
        """
        now = epoch_ms()
        store = self.store
        failures = WriteFailures()
        self.count_retry.step(store, now)
        if effects.dead_letters:
            try:
                self._move_dead_letters(effects.dead_letters, now)
            except StoreError as exc:
                log_store_error("moving dead letters (left in their queues)", exc)
                failures.failed((m.seq for m, _, _ in effects.dead_letters), exc, settle=False)
        if effects.settled:
            seqs = [seq for _, seq in effects.settled]
            try:
                store.settle(seqs, "acked", now)
            except StoreError as exc:
                log_store_error("recording acknowledgements", exc)
                failures.failed(seqs, exc, settle=True)
        if effects.returned:
            seqs = [seq for _, seq in effects.returned]
            try:
                store.record_delivery(seqs)
            except StoreError as exc:
                log_store_error("counting deliveries (kept in memory, written later)", exc)
                failures.failed(seqs, exc, settle=False)
        if effects.flagged:
            try:
                store.record_delivery([seq for _, seq in effects.flagged], counted=False)
            except StoreError as exc:
                log_store_error("flagging redeliveries (kept in memory, written later)", exc)
        self.expired_backlog.extend(seq for _, seq in effects.expired)
        if self.expired_backlog and now >= self.next_cleanup_ms:
            chunk = self.expired_backlog[: self.cleanup_batch]
            self.next_cleanup_ms = now + self.cleanup_gap_ms
            try:
                store.settle(chunk, "expired", now)
            except StoreError as exc:
                log_store_error("settling expired messages (retried in a second)", exc)
                self.next_cleanup_ms = now + 1000
            else:
                del self.expired_backlog[: self.cleanup_batch]
        answer_stored_acks(self.engine, self.outbox, effects.acks, failures)
