"""A real server process and a raw STOMP client, shared by the tests and the benchmarks.

:class:`BrokerProcess` runs ``mpbroker serve`` on free loopback ports (a temporary data
directory if none is given) and knows its workers, its fork server and its /dev/shm
segments; :class:`ServerProcess` runs any server that logs ``ready on HOST:PORT``, the
baseline forwarder of :mod:`mpbroker.loadgen` among them. :class:`RawClient` sends exact
bytes and frames and reads what comes back, on a blocking socket.

    with BrokerProcess("--gateways", "1") as broker:
        client = RawClient(broker.host, broker.port)
        client.connect()
        client.send("SEND", {"destination": "/queue/a", "receipt": "r"}, b"hello")
        client.expect("RECEIPT", "r")
        client.assert_no_frame(0.2)
        client.close()
"""

from ._client import RECV_BYTES, BrokerClosed, FrameTimeout, RawClient, StompError
from ._process import (
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    BrokerProcess,
    ServerError,
    ServerProcess,
    baseline_command,
    broker_command,
)

__all__ = [
    "RECV_BYTES",
    "START_TIMEOUT_S",
    "STOP_TIMEOUT_S",
    "BrokerClosed",
    "BrokerProcess",
    "FrameTimeout",
    "RawClient",
    "ServerError",
    "ServerProcess",
    "StompError",
    "baseline_command",
    "broker_command",
]
