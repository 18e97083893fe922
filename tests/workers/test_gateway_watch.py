"""How a pubsub worker tells that a gateway holding a durable subscription is gone
(`workers.pipeline.gateway_watch`): from the gateway's slot in the control block, and from
its process, which may have ended before the supervisor saw it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from mpbroker.routing import Topology
from mpbroker.shm import STATE_EMPTY, STATE_READY, ControlBlock, remove_instance
from mpbroker.workers._layout import Layout
from mpbroker.workers.pipeline import gateway_watch, process_ended


@pytest.fixture
def layout() -> Iterator[Layout]:
    layout = Layout(f"{os.getpid()}gw", 2, Topology(1, 1))
    block = ControlBlock.create(layout.control, 5)
    block.close()
    yield layout
    remove_instance(layout.instance)


def test_a_killed_process_has_ended_before_it_is_reaped() -> None:
    assert not process_ended(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not process_ended(child.pid)
        os.kill(child.pid, signal.SIGKILL)
        # A zombie until reaped: kill(pid, 0) would still find it.
        deadline = time.monotonic() + 10
        while not process_ended(child.pid):
            assert time.monotonic() < deadline
            time.sleep(0.001)
        os.kill(child.pid, 0)
    finally:
        child.kill()
        child.wait()
    assert process_ended(child.pid)


def test_a_gateway_is_gone_when_its_slot_or_its_process_says_so(layout: Layout) -> None:
    control = ControlBlock.attach(layout.control)
    try:
        gone = gateway_watch(control, layout)
        slot = control.slot(layout.gateway_slot(1))
        slot.pid, slot.incarnation, slot.state = os.getpid(), 3, STATE_READY
        assert not gone(1, 3)
        assert gone(1, 2)  # an older incarnation: its successor runs
        child = subprocess.Popen([sys.executable, "-c", "pass"])
        child.wait()
        slot.pid = child.pid  # ended, the supervisor has not seen it yet
        assert gone(1, 3)
        slot.pid = os.getpid()
        slot.state = STATE_EMPTY  # the supervisor cleared the slot for a successor
        assert gone(1, 3)
    finally:
        control.close()
