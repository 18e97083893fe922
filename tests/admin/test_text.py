"""The text views of the admin API's pages."""

from __future__ import annotations

from mpbroker.admin import (
    DestinationsStatus,
    FlowView,
    GatewayStats,
    GlobalStoreFigures,
    HeldSend,
    MemoryStatus,
    QueueRow,
    QueueWorkerStats,
    StatusView,
    StoreFigures,
    TempStoreStats,
    TopicRow,
    WorkerStats,
    WorkerStatus,
)
from mpbroker.admin.text import render_flow, render_status


def worker(title: str, role: str, stats: WorkerStats | None) -> WorkerStatus:
    return WorkerStatus(
        title=title,
        role=role,
        index=0,
        state="ready",
        pid=10,
        incarnation=0,
        heartbeat_age_ms=5,
        stats=stats,
    )


def gateway(connections: int) -> GatewayStats:
    return GatewayStats(
        title="gateway 0",
        pid=10,
        at_ms=0,
        connections=connections,
        stopped_producers=[],
        stops_known=0,
    )


def p2p(temp: TempStoreStats | None = None) -> QueueWorkerStats:
    return QueueWorkerStats(
        title="p2p 0",
        pid=11,
        at_ms=0,
        received=7,
        delivered=5,
        destinations=[],
        destinations_not_shown=0,
        stores={},
        consumers=[],
        consumers_not_shown=0,
        temp_store=temp,
    )


def test_status_shows_memory_and_each_pipelines_temp_store() -> None:
    temp = TempStoreStats(
        paging=True,
        starts=1,
        messages=1200,
        bytes=3 * 2**20,
        usage_bytes=8 * 2**20,
        limit_bytes=1024 * 2**20,
        full=False,
        segments=1,
        paged_out=1500,
        paged_in=300,
    )
    view = StatusView(
        at_ms=0,
        workers=[worker("gateway 0", "gateway", gateway(3)), worker("p2p 0", "p2p", p2p(temp))],
        memory=MemoryStatus(
            level=2, used_bytes=210 * 2**20, max_memory=256 * 2**20, percent=82, levels=[]
        ),
    )
    text = render_status(view)
    assert text.startswith("memory: level 2, 210 MiB of max_memory 256 MiB (82 %)")
    [line] = [row for row in text.splitlines() if "8/1024" in row]
    assert line.split() == ["p2p", "0", "yes", "1200", "3.0", "8/1024", "no"]
    assert "received 7, delivered 5" in text and "connections 3" in text


def test_status_shows_the_destinations_against_their_limit() -> None:
    view = StatusView(
        at_ms=0,
        workers=[worker("p2p 0", "p2p", None)],
        memory=MemoryStatus(
            level=0, used_bytes=100 * 2**20, max_memory=256 * 2**20, percent=39, levels=[]
        ),
        destinations=DestinationsStatus(
            count=120, max_destinations=7351, per_destination_bytes=3584, budget_bytes=1, refused=4
        ),
    )
    lines = render_status(view).splitlines()
    assert lines[0].startswith("memory: level 0, 100 MiB")
    assert lines[1] == (
        "destinations: 120 of max_destinations 7351 (3584 B each in the budget), 4 refused"
    )


def test_status_without_temp_stores_shows_only_the_workers() -> None:
    view = StatusView(
        at_ms=0,
        workers=[worker("gateway 0", "gateway", gateway(1)), worker("p2p 0", "p2p", None)],
    )
    text = render_status(view)
    assert "temp store" not in text and not text.startswith("memory")
    assert [line.split()[:3] for line in text.splitlines()[1:]] == [
        ["gateway", "0", "ready"],
        ["p2p", "0", "ready"],
    ]


def test_flow_shows_what_holds_something_or_is_stopped_and_the_live_buffer() -> None:
    figures = {"msg_high": 5, "msg_low": 4, "byte_high": -1, "byte_low": -1}
    full = StoreFigures(messages=5, bytes=50, stopped="msg_high 5", **figures)
    empty = StoreFigures(messages=0, bytes=0, stopped="", **figures)
    view = FlowView(
        at_ms=0,
        destinations=[
            QueueRow(
                name="/queue/a",
                waiting=5,
                unacknowledged=0,
                consumers=0,
                stores={"vol_queue_store": full, "pers_queue_store": empty},
                worker="p2p 0",
            ),
            TopicRow(
                name="/topic/t",
                subscribers=1,
                deepest_backlog=3,
                live_msg_high=-1,
                live_msg_low=-1,
                stopped="",
                stores={},
                worker="pubsub 0",
            ),
        ],
        global_stores={
            "p2p 0": {
                "vol_queue_store": GlobalStoreFigures(
                    messages=5,
                    bytes=50,
                    global_msg_high=10,
                    global_msg_low=8,
                    global_byte_high=-1,
                    global_byte_low=-1,
                    stopped="",
                )
            }
        },
        stopped_producers=[
            HeldSend(
                peer="127.0.0.1:5",
                destination="/queue/a",
                limit="msg_high 5",
                store="vol_queue_store",
                waiting_ms=250,
                gateway="gateway 0",
            )
        ],
        consumers=[],
        consumers_not_shown=0,
        durable_subscriptions=[],
        durable_subscriptions_not_shown=0,
        destinations_not_shown=0,
    )
    text = render_flow(view)
    assert "not shown" not in text
    lines = [line.split() for line in text.splitlines()]
    assert ["/queue/a", "vol_queue_store", "5", "50", "5/4", "off", "msg_high", "5"] in lines
    assert not [line for line in lines if "pers_queue_store" in line]
    assert ["/topic/t", "topics", "(live)", "3", "-", "off", "-", "no"] in lines
    assert ["p2p", "0", "vol_queue_store", "5", "50", "10/8", "off", "no"] in lines
    assert [
        "gateway",
        "0",
        "127.0.0.1:5",
        "/queue/a",
        "msg_high",
        "5",
        "250",
    ] in lines


def test_flow_says_how_many_rows_a_page_leaves_out() -> None:
    view = FlowView(
        at_ms=0,
        destinations=[],
        destinations_not_shown=9000,
        global_stores={},
        stopped_producers=[],
        consumers=[],
        consumers_not_shown=12,
        durable_subscriptions=[],
        durable_subscriptions_not_shown=0,
    )
    text = render_flow(view)
    assert "(9000 more destinations not shown)" in text
    assert "(12 more consumers not shown)" in text


def test_a_gateway_shows_its_transactions_once_it_has_any() -> None:
    busy = GatewayStats(
        title="gateway 1",
        pid=12,
        at_ms=0,
        connections=3,
        stopped_producers=[],
        stops_known=0,
        transactions_open=2,
        transactions_bytes=4096,
        transactions_discarded=1,
    )
    view = StatusView(
        at_ms=0,
        workers=[
            worker("gateway 0", "gateway", gateway(3)),
            worker("gateway 1", "gateway", busy),
        ],
    )
    quiet_line, busy_line = render_status(view).splitlines()[1:3]
    assert quiet_line.endswith("connections 3")
    assert busy_line.endswith(
        "connections 3, transactions open 2 (4096 B), discarded 1, timed out 0"
    )
