"""QueuePersistence: stored before accepted, refused (never acknowledged) on store errors."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from mpbroker.config import Config, replace_settings
from mpbroker.engine import Outbox, QueueEngine
from mpbroker.pipeline import QueuePersistence, index_cache
from mpbroker.records import (
    ACK_INDIVIDUAL,
    Ack,
    Deliver,
    Message,
    Nack,
    Receipt,
    Refuse,
    Send,
    Subscribe,
)
from mpbroker.stores import MessageStore, StoredMessage, StoreError
from tests.factories import make_message


def persistent_send(n: int) -> Send:
    message = make_message(f"m{n}", timestamp_ms=1, persistent=True)
    return Send(conn=1, message=message, receipt=f"r{n}")


def make(tmp_path: Path, *, group_commit: bool = True) -> QueuePersistence:
    config = replace_settings(Config(), "store", group_commit=group_commit)
    outbox = Outbox()
    store = MessageStore.open(tmp_path / "p2p-0", config.store)
    engine = QueueEngine(config.queues, 0, outbox, index_cache=index_cache(store, config))
    return QueuePersistence(store, engine, outbox, config)


def test_receipts_follow_the_commit(tmp_path: Path) -> None:
    persistence = make(tmp_path)
    for n in range(3):
        persistence.offer(0, persistent_send(n))
    assert persistence.outbox.take() == {}, "nothing is acknowledged before the commit"
    persistence.commit()
    receipts = [r.receipt for r in persistence.outbox.take()[0] if isinstance(r, Receipt)]
    assert receipts == ["r0", "r1", "r2"]
    assert [s.message.message_id for s in persistence.store.live()] == ["m0", "m1", "m2"]
    persistence.store.close()


def test_group_commit_off_commits_each_message_at_once(tmp_path: Path) -> None:
    persistence = make(tmp_path, group_commit=False)
    persistence.offer(0, persistent_send(0))
    assert [r.receipt for r in persistence.outbox.take()[0] if isinstance(r, Receipt)] == ["r0"]
    persistence.store.close()


def test_a_store_error_refuses_every_message_of_the_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    persistence = make(tmp_path)

    def failing_append(messages: Sequence[Message]) -> list[int]:
        raise StoreError(tmp_path / "p2p-0", "append", "database or disk is full")

    monkeypatch.setattr(persistence.store, "append", failing_append)
    for n in range(2):
        persistence.offer(0, persistent_send(n))
    persistence.commit()
    out = persistence.outbox.take()[0]
    assert all(isinstance(r, Refuse) for r in out)
    assert [r.receipt for r in out if isinstance(r, Refuse)] == ["r0", "r1"]
    assert out[0].message == "store error: append: database or disk is full"  # type: ignore[union-attr]
    assert persistence.engine.depth("/queue/q") == 0
    persistence.store.close()


def test_recovered_messages_come_back_redelivered(tmp_path: Path) -> None:
    first = make(tmp_path)
    first.offer(0, persistent_send(0))
    first.commit()
    first.store.close()
    second = make(tmp_path)
    assert second.recover() == 1
    [message] = list(second.engine.queues["/queue/q"].pending)
    assert message.redelivered and message.deliveries == 1 and message.seq
    second.store.close()


def stored_and_delivered(tmp_path: Path, count: int) -> QueuePersistence:
    """`count` stored messages, delivered to conn 2's client-individual subscription 1."""
    persistence = make(tmp_path)
    for n in range(count):
        persistence.offer(0, persistent_send(n))
    persistence.commit()
    persistence.engine.handle(0, Subscribe(2, 1, "s", "/queue/q", ACK_INDIVIDUAL, 10))
    persistence.outbox.take()
    return persistence


def failing(operation: str, tmp_path: Path) -> StoreError:
    return StoreError(tmp_path / "p2p-0", operation, "database or disk is full (SQLITE_FULL)")


def test_an_ack_is_answered_once_its_settlement_is_stored(tmp_path: Path) -> None:
    persistence = stored_and_delivered(tmp_path, 2)
    persistence.engine.handle(0, Ack(2, 1, "m0", receipt="a0"))
    assert persistence.outbox.take() == {}, "no RECEIPT before the settlement is written"
    persistence.write_back(persistence.engine.take_effects())
    assert persistence.outbox.take() == {0: [Receipt(2, "a0")]}
    assert [s.message.message_id for s in persistence.store.live()] == ["m1"]
    persistence.store.close()


def test_an_ack_the_store_cannot_settle_gets_an_error_and_its_message_comes_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    persistence = stored_and_delivered(tmp_path, 2)
    engine = persistence.engine
    engine.handle(0, Ack(2, 1, "m0", receipt="a0"))
    engine.handle(0, Ack(2, 1, "m1"))  # no receipt asked: an ERROR all the same

    def failing_settle(seqs: Sequence[int], outcome: str, at_ms: int) -> None:
        raise failing("settle", tmp_path)

    monkeypatch.setattr(persistence.store, "settle", failing_settle)
    persistence.write_back(engine.take_effects())
    out = persistence.outbox.take()[0]
    refusals = [r for r in out if isinstance(r, Refuse)]
    assert [(r.conn, r.receipt) for r in refusals] == [(2, "a0"), (2, "")]
    assert refusals[0].message == (
        "ACK not stored: store error: settle: database or disk is full (SQLITE_FULL)"
    )
    assert "unacknowledged" in refusals[0].detail
    assert not [r for r in out if isinstance(r, Receipt)]
    # Back in the queue, redelivered, held and counted as before the ACK: the consumer
    # (whose connection the ERROR closes) got them again at once.
    again = [r.message for r in out if isinstance(r, Deliver)]
    assert [(m.message_id, m.redelivered) for m in again] == [("m0", True), ("m1", True)]
    assert engine.queues["/queue/q"].held_messages == 2
    assert len(persistence.store.live()) == 2
    persistence.store.close()


def test_a_nack_whose_delivery_count_cannot_be_stored_gets_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    persistence = stored_and_delivered(tmp_path, 1)
    engine = persistence.engine
    engine.handle(0, Nack(2, 1, "m0", receipt="n0"))

    def failing_count(seqs: Sequence[int], *, counted: bool = True) -> None:
        raise failing("record_delivery", tmp_path)

    monkeypatch.setattr(persistence.store, "record_delivery", failing_count)
    persistence.write_back(engine.take_effects())
    out = persistence.outbox.take()[0]
    [refusal] = [r for r in out if isinstance(r, Refuse)]
    assert refusal.receipt == "n0"
    assert refusal.message.startswith("NACK not stored: store error: record_delivery: ")
    assert engine.queues["/queue/q"].held_messages == 1  # given back once, not twice
    persistence.store.close()


def test_paged_messages_are_read_back_many_at_a_time_in_seq_order(tmp_path: Path) -> None:
    config = Config()
    with MessageStore.open(tmp_path / "p2p-0", config.store) as store:
        seqs = store.append([make_message(f"m{n}", persistent=True) for n in range(200)])
        queries: list[int] = []
        read_ahead = store.read_ahead

        def counted(seq: int, max_messages: int, max_bytes: int) -> list[StoredMessage]:
            queries.append(seq)
            return read_ahead(seq, max_messages, max_bytes)

        store.read_ahead = counted  # type: ignore[method-assign]
        load = index_cache(store, config).load
        # A backlog delivered in order: one query per READ_AHEAD_MESSAGES.
        assert [load(seq).message_id for seq in seqs[:130]] == [f"m{n}" for n in range(130)]
        assert queries == [seqs[0], seqs[64], seqs[128]]
        # Out of order (a redelivery, a higher priority): read again; the rest is dropped.
        assert load(seqs[5]).message_id == "m5"
        assert load(seqs[131]).message_id == "m131"
        assert queries[3:] == [seqs[5], seqs[131]]


def test_dead_letters_the_store_cannot_take_stay_in_their_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    persistence = stored_and_delivered(tmp_path, 1)
    engine = persistence.engine
    engine.handle(0, Nack(2, 1, "m0", requeue=False, receipt="n0"))

    def failing_append(messages: Sequence[Message]) -> list[int]:
        raise failing("append", tmp_path)

    with monkeypatch.context() as patch:
        patch.setattr(persistence.store, "append", failing_append)
        persistence.write_back(engine.take_effects())
    out = persistence.outbox.take()[0]
    # No RECEIPT for the NACK; the message is back in its queue (delivered again at once),
    # never in a dead-letter queue it is not stored in.
    [refusal] = [r for r in out if isinstance(r, Refuse)]
    assert refusal.receipt == "n0" and refusal.message.startswith("NACK not stored: ")
    assert [r.message.message_id for r in out if isinstance(r, Deliver)] == ["m0"]
    assert "/queue/DLQ.q" not in engine.queues
    # The next refusal moves it, now that the store takes it.
    engine.handle(0, Nack(2, 1, "m0", requeue=False, receipt="n1"))
    persistence.write_back(engine.take_effects())
    assert persistence.outbox.take()[0] == [Receipt(2, "n1")]
    assert [s.message.destination for s in persistence.store.live()] == ["/queue/DLQ.q"]
    persistence.store.close()
