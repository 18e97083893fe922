"""P2PPipeline: records in, records out, with a real store and no rings."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from mpbroker.admin import stopped_by
from mpbroker.config import Config, config_from_mapping
from mpbroker.flow import STORE_QUOTAS, STORE_VOLATILE_QUEUES
from mpbroker.pipeline import P2PPipeline
from mpbroker.records import (
    ACK_CLIENT,
    Ack,
    Barrier,
    BarrierDone,
    Deliver,
    FlowState,
    Hello,
    Message,
    Nack,
    PipelineHello,
    Receipt,
    Record,
    Refuse,
    Registered,
    Send,
    Subscribe,
)
from mpbroker.routing import Topology
from mpbroker.stores import MessageStore, StoreError
from tests.factories import make_message

T = TypeVar("T")
TOPOLOGY = Topology(p2p=1, pubsub=1)
GATEWAYS = 2


def config(**sections: dict[str, Any]) -> Config:
    # Group commit without a delay: a step commits what the batch buffered.
    return config_from_mapping({"store": {"commit_max_delay_ms": 0}, **sections})


@pytest.fixture
def open_pipeline(tmp_path: Path) -> Iterator[Any]:
    opened: list[P2PPipeline] = []

    def make(incarnation: int = 0, settings: Config | None = None) -> P2PPipeline:
        settings = settings or config()
        store = MessageStore.open(tmp_path / "p2p-0", settings.store)
        pipeline = P2PPipeline(0, incarnation, GATEWAYS, settings, TOPOLOGY, store, None)
        pipeline.recover()
        opened.append(pipeline)
        return pipeline

    yield make
    for pipeline in opened:
        pipeline.close()


def of_type(out: dict[int, list[Record]], kind: type[T], gateway: int = 0) -> list[T]:
    return [r for r in out.get(gateway, []) if isinstance(r, kind)]


def message(n: int, *, persistent: bool = False) -> Message:
    return make_message(f"m{n}", persistent=persistent)


def subscribe(sub: int = 1, conn: int = 1) -> Subscribe:
    return Subscribe(conn, sub, f"s{sub}", "/queue/q", ACK_CLIENT, 100)


def turn(pipeline: P2PPipeline, *records: tuple[int, Record]) -> dict[int, list[Record]]:
    """One batch as the worker runs it: records in, the step, the output taken."""
    for gateway, record in records:
        pipeline.receive(gateway, record)
    pipeline.step(memwatch_level=0)
    return pipeline.take_output()


def test_hello_tells_every_gateway_the_pipeline_started(open_pipeline: Any) -> None:
    pipeline = open_pipeline(incarnation=3)
    pipeline.hello()
    out = pipeline.take_output()
    assert out == {g: [PipelineHello(0, 3)] for g in range(GATEWAYS)}


def test_a_persistent_send_is_receipted_after_it_is_stored(open_pipeline: Any) -> None:
    pipeline = open_pipeline()
    pipeline.receive(0, Send(1, message(1, persistent=True), "r1"))
    assert pipeline.take_output() == {}  # buffered: nothing is acknowledged yet
    out = turn(pipeline)
    assert of_type(out, Receipt) == [Receipt(1, "r1")]
    [stored] = pipeline.persistence.store.live()
    assert stored.message.message_id == "m1"


def test_a_barrier_commits_what_came_before_it_first(open_pipeline: Any) -> None:
    pipeline = open_pipeline(
        settings=config_from_mapping({"store": {"commit_max_delay_ms": 60000}})
    )
    pipeline.receive(0, Send(1, message(1, persistent=True), "r1"))
    pipeline.receive(0, Barrier(1, 7))
    out = pipeline.take_output()
    assert out[0] == [Receipt(1, "r1"), BarrierDone(1, 7, 0)]


def test_stored_messages_come_back_redelivered_after_a_restart(open_pipeline: Any) -> None:
    first = open_pipeline()
    turn(first, (0, Send(1, message(1, persistent=True))))
    first.close()
    second = open_pipeline(incarnation=1)
    out = turn(second, (0, Registered(0, 1)), (1, Registered(1, 1)), (0, subscribe()))
    [deliver] = of_type(out, Deliver)
    assert deliver.message.message_id == "m1" and deliver.message.redelivered


def test_a_restarted_pipeline_holds_records_until_every_gateway_registered(
    open_pipeline: Any,
) -> None:
    pipeline = open_pipeline(incarnation=1)
    out = turn(pipeline, (0, Send(1, message(1))), (0, subscribe()))
    assert of_type(out, Deliver) == []  # the SEND waits; the Subscribe went through
    assert pipeline.holding()
    out = turn(pipeline, (0, Registered(0, 1)))
    assert of_type(out, Deliver) == [] and pipeline.holding()  # gateway 1 has not answered
    out = turn(pipeline, (1, Registered(1, 1)))
    [deliver] = of_type(out, Deliver)
    assert deliver.message.message_id == "m1" and not pipeline.holding()


def test_a_stop_goes_to_every_gateway_and_a_restarted_gateway_hears_it_again(
    open_pipeline: Any,
) -> None:
    settings = config(vol_queue_store={"msg_high": 2, "msg_low": 1})
    pipeline = open_pipeline(settings=settings)
    out = turn(pipeline, (0, Send(1, message(1))), (0, Send(1, message(2))))
    stop = FlowState(0, STORE_VOLATILE_QUEUES, "/queue/q", "msg_high 2")
    assert of_type(out, FlowState, 0) == of_type(out, FlowState, 1) == [stop]
    out = turn(pipeline, (1, Hello(1, 1)))
    assert of_type(out, FlowState, 1) == [stop]
    # Acknowledged below the low mark: released, for every gateway.
    turn(pipeline, (0, subscribe()))
    out = turn(pipeline, (0, Ack(1, 1, "m2")))
    release = FlowState(0, STORE_VOLATILE_QUEUES, "/queue/q", "")
    assert of_type(out, FlowState, 0) == of_type(out, FlowState, 1) == [release]


def test_a_full_quota_holds_a_send_until_a_message_leaves(open_pipeline: Any) -> None:
    settings = config(
        stomp={"max_frame_bytes": 1024, "max_header_bytes": 512},
        quotas={"one": {"max_messages": 1, "max_bytes": 1024}},
        destinations={"/queue/*": {"quota": "one"}},
    )
    pipeline = open_pipeline(settings=settings)
    out = turn(pipeline, (0, Send(1, message(1))), (0, Send(1, message(2), "r2")))
    assert of_type(out, Receipt) == []
    assert of_type(out, FlowState, 1) == [
        FlowState(0, STORE_QUOTAS, "/queue/q", "quota one max_messages 1, max_bytes 1024")
    ]
    # The admin API (and /metrics) see the stop, and count it.
    [row] = pipeline.statistics("p2p 0", 1, 0).destinations
    assert (row.quota_stopped, stopped_by(row), row.stops) == (
        "quota one max_messages 1, max_bytes 1024",
        "quota one max_messages 1, max_bytes 1024",
        1,
    )
    turn(pipeline, (0, subscribe()))
    out = turn(pipeline, (0, Ack(1, 1, "m1")))  # m1 leaves: m2 is let in
    assert of_type(out, Receipt) == [Receipt(1, "r2")]
    assert of_type(out, FlowState, 1) == [FlowState(0, STORE_QUOTAS, "/queue/q", "")]
    [row] = pipeline.statistics("p2p 0", 1, 0).destinations
    assert (row.quota_stopped, row.stops) == ("", 1)


def test_a_commit_receipt_waits_for_its_send_in_the_quota_room(open_pipeline: Any) -> None:
    settings = config(
        stomp={"max_frame_bytes": 1024, "max_header_bytes": 512},
        quotas={"one": {"max_messages": 1, "max_bytes": 1024}},
        destinations={"/queue/*": {"quota": "one"}},
    )
    pipeline = open_pipeline(settings=settings)
    out = turn(
        pipeline,
        (0, Send(1, message(1))),
        (0, Send(2, message(2, persistent=True))),
        (0, Barrier(2, 9)),
        (0, Barrier(1, 8)),
    )
    assert of_type(out, BarrierDone) == [BarrierDone(1, 8, 0)]  # connection 2's waits
    turn(pipeline, (0, subscribe()))
    out = turn(pipeline, (0, Ack(1, 1, "m1")))  # m1 leaves: m2 is let in, then stored
    assert of_type(out, BarrierDone) == [BarrierDone(2, 9, 0)]
    assert [d.message.message_id for d in of_type(out, Deliver)] == ["m2"]


def test_reload_judges_every_queue_again(open_pipeline: Any) -> None:
    pipeline = open_pipeline()
    turn(pipeline, *[(0, Send(1, message(n))) for n in range(3)])
    pipeline.reload(config(vol_queue_store={"msg_high": 2, "msg_low": 1}))
    out = turn(pipeline)
    assert of_type(out, FlowState) == [
        FlowState(0, STORE_VOLATILE_QUEUES, "/queue/q", "msg_high 2")
    ]


def test_statistics_show_each_queue_and_consumer(open_pipeline: Any) -> None:
    pipeline = open_pipeline()
    turn(pipeline, (0, Send(1, message(1))), (0, Send(1, message(2))), (0, subscribe()))
    stats = pipeline.statistics("p2p 0", 42, 7)
    assert (stats.received, stats.delivered) == (2, 2)
    [row] = stats.destinations
    assert (row.name, row.waiting, row.unacknowledged, row.consumers) == ("/queue/q", 0, 2, 1)
    assert row.stores["vol_queue_store"].messages == 2
    [consumer] = stats.consumers
    assert (consumer.unacknowledged, consumer.ack) == (2, "client")


def test_after_a_clean_stop_only_what_was_delivered_comes_back_redelivered(
    open_pipeline: Any,
) -> None:
    first = open_pipeline()
    sends = [(0, Send(1, message(n, persistent=True), f"r{n}")) for n in range(3)]
    turn(first, *sends)
    # m0 reaches a consumer (and stays in its window): the others were never delivered.
    consumer = Subscribe(1, 1, "s1", "/queue/q", ACK_CLIENT, 1)
    assert [d.message.message_id for d in of_type(turn(first, (0, consumer)), Deliver)] == ["m0"]
    first.close(clean=True)
    again = open_pipeline(incarnation=1)
    restored = list(again.queue_engine.queues["/queue/q"].pending)
    assert [(m.message_id, m.redelivered) for m in restored] == [
        ("m0", True),
        ("m1", False),
        ("m2", False),
    ]
    # The mark is taken at start: after a crash of this run, everything is flagged again.
    third = open_pipeline(incarnation=2)
    assert all(m.redelivered for m in third.queue_engine.queues["/queue/q"].pending)


def test_the_disk_free_limit_stops_persistent_producers_and_is_told_to_a_new_gateway(
    open_pipeline: Any,
) -> None:
    pipeline = open_pipeline()
    assert pipeline.disk is not None
    free = [10 * 1024**3]
    pipeline.disk.read = lambda directory: (free[0], 100 * 1024**3)
    turn(pipeline)
    free[0] = 1024**2  # 1 MiB: below the default 64 MiB
    pipeline.disk._next_check = 0.0  # (read once a second: now)
    out = turn(pipeline)
    stop = FlowState(0, "disk", "", f"disk_free_limit {64 * 1024**2}")
    assert of_type(out, FlowState, 0) == [stop] and of_type(out, FlowState, 1) == [stop]
    out = turn(pipeline, (1, Hello(1, 1)))  # a restarted gateway hears it again
    assert stop in of_type(out, FlowState, 1)
    free[0] = 10 * 1024**3
    pipeline.disk._next_check = 0.0
    out = turn(pipeline)
    assert of_type(out, FlowState, 0) == [FlowState(0, "disk", "", "")]


def failing_store_writes(pipeline: P2PPipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    store = pipeline.persistence.store

    def fail(*args: object) -> None:
        raise StoreError(store.directory, "settle", "database or disk is full (SQLITE_FULL)")

    monkeypatch.setattr(store, "settle", fail)


def test_a_barrier_is_answered_after_the_error_of_an_ack_that_could_not_be_stored(
    open_pipeline: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A COMMIT's or DISCONNECT's RECEIPT (a barrier) must not overtake that ERROR.
    pipeline = open_pipeline()
    turn(pipeline, (0, subscribe()), (0, Send(2, message(1, persistent=True))))
    failing_store_writes(pipeline, monkeypatch)
    out = turn(pipeline, (0, Ack(1, 1, "m1")), (0, Barrier(1, 7)))
    kinds = [type(r).__name__ for r in out[0] if isinstance(r, Refuse | BarrierDone)]
    assert kinds == ["Refuse", "BarrierDone"]


def test_a_nack_without_requeue_that_could_not_be_settled_gets_an_error(
    open_pipeline: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A dead-letter queue has no dead-letter queue: NACK requeue:false settles the message.
    pipeline = open_pipeline()
    dead = make_message("d1", "/queue/DLQ.q", persistent=True)
    turn(
        pipeline,
        (0, Subscribe(1, 1, "s", "/queue/DLQ.q", ACK_CLIENT, 10)),
        (0, Send(2, dead)),
    )
    failing_store_writes(pipeline, monkeypatch)
    out = turn(pipeline, (0, Nack(1, 1, "d1", receipt="n", requeue=False)))
    assert [r.receipt for r in of_type(out, Refuse)] == ["n"]
    assert of_type(out, Receipt) == []
    assert [s.message.message_id for s in pipeline.persistence.store.live()] == ["d1"]
