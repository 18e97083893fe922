"""VolatilePaging: when non-persistent messages go to the temp store and come back, and when
a full temp store stops their producers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mpbroker.config import Config, config_from_mapping
from mpbroker.engine import Outbox, QueueEngine
from mpbroker.pipeline import VolatilePaging, open_temp_store
from mpbroker.pipeline._paging import queue_paging_mark
from mpbroker.records import ACK_AUTO, Send, Subscribe
from mpbroker.stores import TempStore
from tests.factories import make_message

BODY = b"x" * 1000


def config(**temp: object) -> Config:
    return config_from_mapping(
        {
            # Paging starts at 4000 bytes of waiting messages, stops at 2000.
            "vol_queue_store": {"global_byte_high": 4000, "global_byte_low": 2000},
            "temp_store": {"segment_bytes": "64KiB", "page_step_bytes": 4096, **temp},
            "memory": {"throttle_level": 2},
        }
    )


@pytest.fixture
def paged(tmp_path: Path) -> Iterator[tuple[QueueEngine, VolatilePaging, TempStore]]:
    settings = config()
    store = open_temp_store(settings, tmp_path / "temp")
    engine = QueueEngine(settings.queues, 0, Outbox(), pager=store)
    paging = VolatilePaging(engine, store, settings, queue_paging_mark)
    yield engine, paging, store
    paging.close()


def send(engine: QueueEngine, count: int, start: int = 0) -> None:
    for n in range(start, start + count):
        engine.handle(0, Send(1, make_message(f"m{n}", body=BODY)))


def test_paging_starts_at_the_high_mark_and_stops_at_the_low_one(
    paged: tuple[QueueEngine, VolatilePaging, TempStore],
) -> None:
    engine, paging, _ = paged
    send(engine, 3)
    assert paging.step(memwatch_level=0) is None and not engine.paging
    send(engine, 2, start=3)  # 5 x ~1000 bytes: over the high mark
    assert paging.step(memwatch_level=0) is None  # paging, and not full: producers go on
    assert engine.paging and engine.held_bytes <= 2000
    assert engine.paged_messages >= 3
    stats = paging.statistics()
    assert stats.paging and stats.starts == 1 and not stats.full
    assert stats.messages == engine.paged_messages


def test_memwatch_at_the_throttle_level_pages_everything(
    paged: tuple[QueueEngine, VolatilePaging, TempStore],
) -> None:
    engine, paging, _ = paged
    send(engine, 2)
    paging.step(memwatch_level=2)
    assert engine.paging and engine.held_bytes == 0 and engine.paged_messages == 2
    paging.step(memwatch_level=0)  # memory back, and under the low mark: paging stops
    assert not engine.paging


def test_a_full_temp_store_stops_producers_until_a_unit_is_freed(tmp_path: Path) -> None:
    settings = config(limit_bytes="64KiB")
    store = open_temp_store(settings, tmp_path / "temp")
    engine = QueueEngine(settings.queues, 0, Outbox(), pager=store)
    paging = VolatilePaging(engine, store, settings, queue_paging_mark)
    try:
        send(engine, 100)
        stopped = None
        for _ in range(50):
            stopped = paging.step(memwatch_level=2) or stopped
        assert stopped is True and paging.stopped and store.full
        # A consumer takes everything: the pages go, and so does the stop.
        engine.handle(0, Subscribe(1, 1, "s", "/queue/q", ACK_AUTO, 1000))
        assert paging.step(memwatch_level=0) is False
        assert not paging.stopped
    finally:
        paging.close()
