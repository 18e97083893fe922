from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from mpbroker.harness import BrokerProcess, RawClient, ServerProcess
from tests.commands import gone

# The test machines are shared and noisy: a property test must never fail because one
# example happened to be slow to run or to generate.
settings.register_profile("mpbroker", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("mpbroker")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One real broker per test module (2 gateways, 1 p2p, 1 pubsub), stopped with SIGTERM.

    Teardown checks what every user relies on: exit code 0 and nothing left in /dev/shm.
    """
    with BrokerProcess("--gateways", "2", data_dir=tmp_path_factory.mktemp("data")) as proc:
        yield proc


@pytest.fixture
def start_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[type[BrokerProcess]]:
    """Start brokers of one's own (for tests that kill things); all stopped at the end."""
    started: list[BrokerProcess] = []

    class _Started(BrokerProcess):
        def __init__(
            self, *args: str, config: str | None = None, data_dir: Path | None = None
        ) -> None:
            super().__init__(
                *args, data_dir=data_dir or tmp_path_factory.mktemp("data"), config=config
            )
            started.append(self)
            self.start()

    yield _Started
    for proc in started:
        proc.stop()  # also reaps and closes the pipes of brokers a test killed


@pytest.fixture
def clients() -> Iterator[list[RawClient]]:
    """A list for the RawClients a test makes its own way (bound to a source address, say);
    every one in it is closed when the test ends."""
    made: list[RawClient] = []
    yield made
    for client in made:
        client.close()


@pytest.fixture
def raw() -> Iterator[Callable[[ServerProcess], RawClient]]:
    """Make RawClients to a broker (or another server); every one is closed when the test
    ends."""
    clients: list[RawClient] = []

    def make(proc: ServerProcess) -> RawClient:
        client = RawClient(proc.host, proc.port)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def baseline() -> Iterator[ServerProcess]:
    """A running baseline forwarder (``python -m mpbroker.loadgen.baseline``); the test fails
    if SIGTERM does not stop it with status 0."""
    with ServerProcess.baseline() as server:
        yield server
    assert gone(server.pid)


@pytest.fixture
def baseline_client(
    baseline: ServerProcess, raw: Callable[[ServerProcess], RawClient]
) -> Callable[[], RawClient]:
    """Make RawClients connected to the baseline server; closed when the test ends."""

    def connect() -> RawClient:
        client = raw(baseline)
        client.connect()
        return client

    return connect
