"""Fixtures of the bench tests: a baseline server in a child process, stopped afterwards."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from bench.servers import ServerProcess


def gone(pid: int) -> bool:
    """Whether no process has id ``pid`` (our children are reaped by the time we ask)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def baseline() -> Iterator[ServerProcess]:
    """A running ``python -m bench.baseline``; the test fails if SIGTERM does not stop it
    with status 0."""
    server = ServerProcess.baseline().start()
    try:
        yield server
    finally:
        server.stop_checked()
    assert gone(server.pid)
