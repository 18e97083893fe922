"""The supervisor's side of systemd (`ServiceLink`): when WATCHDOG=1 and STATUS go out."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from mpbroker.systemd import Counters, Notifier, WorkerBeat
from mpbroker.workers._service import STATUS_INTERVAL_S, BrokerFigures, ServiceLink


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[tuple[Notifier, socket.socket]]:
    path = str(tmp_path / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.setblocking(False)
    notifier = Notifier(path, watchdog_s=1.0)
    yield notifier, sock
    notifier.close()
    sock.close()


def received(sock: socket.socket) -> list[str]:
    got = []
    while True:
        try:
            got.append(sock.recv(4096).decode())
        except BlockingIOError:
            return got


def figures(*beats: WorkerBeat, received_total: int = 0) -> BrokerFigures:
    return BrokerFigures(
        connections=3,
        counters={"p2p 0": Counters(0, received_total, received_total)},
        memory_used=50 * 2**20,
        max_memory=256 * 2**20,
        memory_level=0,
        beats=beats,
        restarts=0,
    )


HEALTHY = WorkerBeat("p2p 0", True, 5)
SILENT = WorkerBeat("p2p 0", True, 20_000)


def test_watchdog_pings_at_its_interval_while_healthy(
    manager: tuple[Notifier, socket.socket],
) -> None:
    notifier, sock = manager
    link = ServiceLink(notifier, 15_000, 60_000)
    link.ready(0.0, figures(HEALTHY))
    assert received(sock)[0].startswith("READY=1\nSTATUS=3 connections")
    pings = 0
    for tick in range(40):  # 4 s in steps of 0.1 s: a ping per second
        link.tick(tick / 10, figures(HEALTHY))
        pings += received(sock).count("WATCHDOG=1")
    assert pings == 4
    assert link.next_due(3.95) == pytest.approx(0.05)


def test_no_ping_while_unhealthy_and_one_at_once_when_healthy_again(
    manager: tuple[Notifier, socket.socket], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mpbroker.supervisor")
    notifier, sock = manager
    link = ServiceLink(notifier, 15_000, 60_000)
    link.tick(0.0, figures(HEALTHY))
    assert "WATCHDOG=1" in received(sock)
    link.tick(1.0, figures(SILENT))
    got = received(sock)
    assert "WATCHDOG=1" not in got
    # What is wrong shows at once in the status line.
    assert any(g.startswith("STATUS=") and "p2p 0 silent for 20.0 s" in g for g in got)
    for tick in range(2, 10):
        link.tick(float(tick), figures(SILENT))
    assert "WATCHDOG=1" not in received(sock)
    link.tick(10.05, figures(HEALTHY))
    assert "WATCHDOG=1" in received(sock)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("watchdog: not healthy (p2p 0 silent" in m for m in messages) == 1
    assert sum(m == "watchdog: healthy again" for m in messages) == 1


def test_status_is_refreshed_with_the_rates(manager: tuple[Notifier, socket.socket]) -> None:
    notifier, sock = manager
    link = ServiceLink(notifier, 15_000, 60_000)
    link.ready(0.0, figures(HEALTHY, received_total=0))
    received(sock)
    link.tick(STATUS_INTERVAL_S, figures(HEALTHY, received_total=4000))
    statuses = [g for g in received(sock) if g.startswith("STATUS=")]
    assert statuses == [
        "STATUS=3 connections, 2,000 msg/s in, 2,000 msg/s out; memory 50 MiB of 256 MiB "
        "(level 0); 1 of 1 workers ready"
    ]


def test_without_a_service_manager_nothing_is_sent_and_nothing_breaks() -> None:
    link = ServiceLink(None, 15_000, 60_000)
    link.ready(0.0, figures(HEALTHY))
    link.tick(1.0, figures(SILENT))
    link.reloading()
    link.stopping("SIGTERM")
    assert link.next_due(1.0) == pytest.approx(STATUS_INTERVAL_S)  # refreshed at 1.0
