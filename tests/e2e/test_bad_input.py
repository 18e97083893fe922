"""Bad input gets a clear ERROR and a closed connection; the broker and others carry on."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mpbroker.harness import BrokerProcess, RawClient

RawFactory = Callable[[BrokerProcess], RawClient]

LIMITS = """
[broker]
max_connections = 20
[stomp]
max_frame_bytes = 8192
max_headers = 10
max_header_bytes = 256
connect_timeout_ms = 1500
frame_timeout_ms = 1500
"""


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    data_dir = tmp_path_factory.mktemp("data")
    with BrokerProcess("--gateways", "2", data_dir=data_dir, config=LIMITS) as proc:
        yield proc


def error_of(client: RawClient) -> str:
    """The one ERROR frame's message, asserting the broker then closed the connection."""
    frames = client.recv_until_closed()
    assert [f.command for f in frames] == ["ERROR"], frames
    return frames[0].headers["message"]


def still_serving(broker: BrokerProcess, raw: RawFactory) -> None:
    """A fresh connection can still send and receive.

    Connections that just closed are counted against max_connections until their gateway
    has finished with them, so a refusal right after a burst is retried for a moment.
    """
    deadline = time.monotonic() + 10
    while True:
        client = raw(broker)
        client.send("CONNECT", {"accept-version": "1.2", "host": "/"})
        reply = client.recv()
        if reply.command == "CONNECTED":
            break
        assert "max_connections" in reply.headers["message"], reply
        assert time.monotonic() < deadline, "connections are never released"
        time.sleep(0.05)
    client.send("SUBSCRIBE", {"destination": "/queue/alive", "id": "a"})
    client.send("SEND", {"destination": "/queue/alive"}, b"ok")
    assert client.recv().body == b"ok"
    client.send("DISCONNECT", {"receipt": "bye"})
    assert client.recv().command == "RECEIPT"


CASES: dict[str, tuple[bytes, str]] = {
    "header line without colon": (
        b"SEND\ndestination:/queue/a\nno-colon-here\n\nbody\x00",
        "malformed frame",
    ),
    "unknown command": (b"FLY\n\n\x00", "unknown command 'FLY'"),
    "frame larger than max_frame_bytes": (
        b"SEND\ndestination:/queue/a\ncontent-length:9000\n\n" + b"x" * 9000 + b"\x00",
        "exceeds max_frame_bytes 8192",
    ),
    "more headers than max_headers": (
        b"SEND\ndestination:/queue/a\n" + b"".join(b"h%d:v\n" % i for i in range(11)) + b"\nx\x00",
        "max_headers 10",
    ),
    "header longer than max_header_bytes": (
        b"SEND\ndestination:/queue/a\nbig:" + b"v" * 300 + b"\n\nx\x00",
        "max_header_bytes 256",
    ),
    "body longer than content-length": (
        b"SEND\ndestination:/queue/a\ncontent-length:2\n\nabcdef\x00",
        "content-length",
    ),
    "unknown header escape": (b"SEND\ndestination:/queue/a\nx:a\\tb\n\nx\x00", "\\t"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_frame_gets_error_and_close(limited: BrokerProcess, raw: RawFactory, case: str) -> None:
    data, expected = CASES[case]
    bystander = raw(limited)
    bystander.connect()
    bystander.send("SUBSCRIBE", {"destination": "/topic/bystander", "id": "b", "receipt": "r"})
    assert bystander.recv().command == "RECEIPT"
    client = raw(limited)
    client.connect()
    client.send_bytes(data)
    message = error_of(client)
    assert expected in message, message
    # The other connection is unaffected.
    bystander.send("SEND", {"destination": "/topic/bystander"}, b"still here")
    assert bystander.recv().body == b"still here"
    limited.wait_for_log("protocol error from")
    still_serving(limited, raw)


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        (("SEND", {"destination": "/nowhere/x"}), "unknown destination '/nowhere/x'"),
        (("SEND", {"destination": "/queue/"}), "unknown destination '/queue/'"),
        (("SEND", {}), "SEND needs a destination header"),
        (
            ("SUBSCRIBE", {"destination": "/queue/a", "id": "s", "ack": "sometimes"}),
            "unknown ack mode 'sometimes'",
        ),
        (
            ("SUBSCRIBE", {"destination": "/queue/a", "id": "s", "activemq.prefetchSize": "0"}),
            "activemq.prefetchSize",
        ),
        (("ACK", {"id": "made-up"}), "ACK id 'made-up' matches no message"),
        (("COMMIT", {"transaction": "never-begun"}), "no open transaction 'never-begun'"),
        (("CONNECT", {"accept-version": "1.2"}), "CONNECT is not valid after CONNECT"),
    ],
)
def test_bad_request_gets_error_naming_it(
    limited: BrokerProcess, raw: RawFactory, frame: tuple[str, dict[str, str]], expected: str
) -> None:
    client = raw(limited)
    client.connect()
    command, headers = frame
    client.send(command, {**headers, "receipt": "r1"})
    frames = client.recv_until_closed()
    assert [f.command for f in frames] == ["ERROR"], frames
    assert expected in frames[0].headers["message"], frames[0].headers
    assert frames[0].headers.get("receipt-id") == "r1"


def test_frame_before_connect(limited: BrokerProcess, raw: RawFactory) -> None:
    client = raw(limited)
    client.send("SEND", {"destination": "/queue/a"}, b"x")
    assert error_of(client) == "expected CONNECT, got SEND"


def test_unsupported_version(limited: BrokerProcess, raw: RawFactory) -> None:
    client = raw(limited)
    client.send("CONNECT", {"accept-version": "2.0", "host": "/"})
    assert error_of(client) == "unsupported protocol version"


def test_no_connect_within_timeout(limited: BrokerProcess, raw: RawFactory) -> None:
    client = raw(limited)
    assert "no CONNECT within connect_timeout_ms 1500" in error_of(client)


def test_a_frame_trickled_a_byte_at_a_time_is_cut_off(
    limited: BrokerProcess, raw: RawFactory
) -> None:
    """Slowloris: every byte resets any silence timer, so a frame must complete within
    stomp.frame_timeout_ms of its first byte."""
    client = raw(limited)
    client.send("CONNECT", {"accept-version": "1.2", "host": "/"})
    assert client.recv().command == "CONNECTED"
    started = time.monotonic()
    try:
        for byte in b"SEND\ndestination:/queue/slow\nreceipt:r\n\nnever ends":
            client.sock.sendall(bytes([byte]))
            time.sleep(0.2)
    except OSError:
        pass  # closed by the broker while trickling: what is tested
    assert error_of(client) == "frame not complete within frame_timeout_ms 1500"
    assert time.monotonic() - started < 10
    limited.wait_for_log(r"closing 127\.0\.0\.1:\d+: frame not complete within")


def test_frames_streamed_back_to_back_for_longer_than_the_frame_timeout_are_fine(
    limited: BrokerProcess, raw: RawFactory
) -> None:
    """Each read ends in the middle of a frame, for 3 s (twice frame_timeout_ms): every
    frame completes quickly, so nothing is cut off."""
    client = raw(limited)
    client.send("CONNECT", {"accept-version": "1.2", "host": "/"})
    assert client.recv().command == "CONNECTED"
    one = b"SEND\ndestination:/queue/streamed\n\nbody\x00"
    stream = one * 300 + b"SEND\ndestination:/queue/streamed\nreceipt:end\n\nlast\x00"
    chunk = len(one) * 2 // 3 + 1  # never a whole number of frames
    for at in range(0, len(stream), chunk):
        client.sock.sendall(stream[at : at + chunk])
        time.sleep(3 / (len(stream) / chunk))
    reply = client.recv()
    assert (reply.command, reply.headers.get("receipt-id")) == ("RECEIPT", "end")


def test_connect_disconnect_loop(limited: BrokerProcess, raw: RawFactory) -> None:
    for _ in range(150):
        client = RawClient(limited.host, limited.port)
        try:
            client.connect()
            client.send("DISCONNECT", {"receipt": "bye"})
            assert client.recv().command == "RECEIPT"
        finally:
            client.close()
    for _ in range(150):  # and clients that vanish without a word
        RawClient(limited.host, limited.port).close()
    still_serving(limited, raw)


def test_more_than_max_connections_is_refused_clearly(
    limited: BrokerProcess, raw: RawFactory
) -> None:
    still_serving(limited, raw)  # earlier tests' connections are released
    clients = [raw(limited) for _ in range(20)]
    for client in clients:
        client.connect()
    extra = raw(limited)
    assert error_of(extra) == "connection refused: max_connections 20 reached"
    limited.wait_for_log("refused connection from .*: max_connections 20 reached")
    clients[0].send("DISCONNECT", {"receipt": "bye"})
    assert clients[0].recv().command == "RECEIPT"
    clients[0].close()
    # A freed place can be taken again (the count is shared by both gateways).
    for client in clients[1:]:
        client.close()
    still_serving(limited, raw)


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ("[broker]\ngateways = -2\n", "broker.gateways = -2: must be an integer from 0 to 256"),
        ("[broker]\nworkers = 3\n", "broker.workers = 3: unknown setting"),
        ("[queues]\nmax_bytes = 'lots'\n", "queues.max_bytes = 'lots'"),
        ("[rings]\ncapacity_bytes = 5000\n", "rings.capacity_bytes = 5000: must be a power of two"),
        ("[stomp\n", "not valid TOML"),
    ],
)
def test_bad_config_is_refused_at_start(tmp_path: Path, config: str, expected: str) -> None:
    path = tmp_path / "broker.toml"
    path.write_text(config)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mpbroker",
            "serve",
            "--config",
            str(path),
            "--port",
            "0",
            "--data-dir",
            str(tmp_path / "data"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert expected in result.stderr, result.stderr
