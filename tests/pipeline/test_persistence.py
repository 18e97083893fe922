"""QueuePersistence: stored before accepted, refused (never acknowledged) on store errors."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from mpbroker.config import Config, replace_settings
from mpbroker.engine import Outbox, QueueEngine
from mpbroker.pipeline import QueuePersistence, index_cache
from mpbroker.records import Message, Receipt, Refuse, Send
from mpbroker.stores import MessageStore, StoreError
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
    assert "store error" in out[0].message  # type: ignore[union-attr]
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
