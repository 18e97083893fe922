"""STOMP over TLS end to end: a broker with `stomp.tls_port = 0` and certificates made here
(tests/security/test_tls.py: `make_pki`), stomp.py and our clients over it, the plain port
beside it, what is refused (TLS 1.1, no or a stranger's client certificate, plain STOMP, a
client that says nothing), and the start-up refusals of bad files."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import stomp
import trio

from mpbroker.client import ConnectionClosed, connect, open_connection
from mpbroker.harness import BrokerProcess
from tests.security.test_tls import PASSPHRASE, Pki, make_pki

pytestmark = pytest.mark.slow

# Short, so that the test of a client that says nothing is short; long enough for every
# other client to send its CONNECT on a busy machine.
CONNECT_TIMEOUT_MS = 2000


def tls_config(pki: Pki, *, ca: bool = True, required: bool = False, **more: str) -> str:
    lines = [
        "[stomp]",
        "tls_port = 0",
        f'tls_cert_file = "{pki.server_cert}"',
        f'tls_key_file = "{pki.server_key}"',
        f"connect_timeout_ms = {CONNECT_TIMEOUT_MS}",
    ]
    if ca:
        lines.append(f'tls_ca_file = "{pki.ca}"')
    if required:
        lines.append("tls_require_client_cert = true")
    lines += [f"{key} = {value}" for key, value in more.items()]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[BrokerProcess]:
    """Two gateways; a CA file, client certificates optional; debug lines (the CN)."""
    data = tmp_path_factory.mktemp("tls") / "data"
    with BrokerProcess(
        "--log-level", "debug", gateways=2, config=tls_config(pki), data_dir=data
    ) as proc:
        yield proc


@pytest.fixture
def fresh(start_broker: type[BrokerProcess], pki: Pki) -> BrokerProcess:
    """A broker of the test's own, TLS as `broker`'s, one gateway. The log says the first
    failed handshake in 10 s, from whatever address, and only counts the next ones (sums
    them up when the 10 s end, or the broker stops): a test that must read its failure's
    line needs a broker where it is the first."""
    return start_broker("--gateways", "1", "--log-level", "debug", config=tls_config(pki))


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[BrokerProcess]:
    """Client certificates required."""
    data = tmp_path_factory.mktemp("strict") / "data"
    with BrokerProcess(config=tls_config(pki, required=True), data_dir=data) as proc:
        yield proc


def stomp_py(broker: BrokerProcess, pki: Pki, certificate: Path | None = None) -> stomp.Connection:
    """A stomp.py connection to the TLS port that checks the broker's certificate (with
    `certificate`, alice's or another, as the client's)."""
    address = (broker.host, broker.tls_port)
    conn = stomp.Connection12([address], reconnect_attempts_max=1, timeout=10)
    key = None if certificate is None else certificate.with_suffix(".key")
    conn.set_ssl(
        for_hosts=[address],
        ca_certs=str(pki.ca),
        cert_file=None if certificate is None else str(certificate),
        key_file=None if key is None else str(key),
    )
    return conn


def refused_within(conn: stomp.Connection, seconds: float) -> bool:
    """Whether the broker refused `conn` within `seconds` without letting it connect:
    stomp.py gave up (its transport stopped or saw an error), or the TCP connection is no
    longer established (the broker closed it). The second, because stomp.py does not
    always notice: its `connect(wait=True)` waits with no bound, and on a loaded machine
    its TLS reader kept waiting on a socket the broker had closed (a CI run hung 300 s)."""
    transport = conn.transport
    try:
        local = transport.socket.getsockname()[:2]
    except (AttributeError, OSError):
        local = None  # no socket: the connection failed already
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            if conn.is_connected():
                return False
            if not transport.running or transport.connection_error or local is None:
                return True
            if not any(
                c.laddr[:2] == local and c.status == psutil.CONN_ESTABLISHED
                for c in psutil.net_connections("tcp")
            ):
                return True
            time.sleep(0.05)
        return False
    finally:
        transport.running = False  # its reader thread ends at its next read


class Collected(stomp.ConnectionListener):
    """stomp.py's messages, and an event once `count` came."""

    def __init__(self, count: int) -> None:
        self.bodies: list[str] = []
        self.count = count
        self.done = threading.Event()

    def on_message(self, frame: stomp.utils.Frame) -> None:
        self.bodies.append(frame.body)
        if len(self.bodies) >= self.count:
            self.done.set()


def gateway_pids(broker: BrokerProcess) -> dict[str, int]:
    return {title: p.pid for title, p in broker.workers().items() if title.startswith("gateway")}


def from_address(broker: BrokerProcess, source: str) -> socket.socket:
    """A TCP connection to the TLS port from the loopback address `source` (127.0.0.0/8 is
    all loopback), which the log line of a failure names."""
    return socket.create_connection(
        (broker.host, broker.tls_port), timeout=10, source_address=(source, 0)
    )


# -- clients over TLS ---------------------------------------------------------------------


def test_stomp_py_sends_and_receives_over_tls(broker: BrokerProcess, pki: Pki) -> None:
    assert broker.tls_port not in (0, broker.port)
    conn = stomp_py(broker, pki)
    collected = Collected(5)
    conn.set_listener("c", collected)
    conn.connect(wait=True)
    try:
        conn.subscribe("/queue/tls.stomp-py", id="s", ack="auto", headers={"receipt": "r"})
        time.sleep(0.3)
        for n in range(5):
            conn.send("/queue/tls.stomp-py", f"secret {n}")
        assert collected.done.wait(10)
        assert collected.bodies == [f"secret {n}" for n in range(5)]
    finally:
        conn.disconnect()
    # The broker took it for TLS 1.2 or later, with no client certificate.
    broker.wait_for_log(r"TLS from 127\.0\.0\.1:\d+: TLSv1\.[23], \S+, client certificate none")


def test_our_sync_client_sends_and_receives_over_tls(broker: BrokerProcess, pki: Pki) -> None:
    context = pki.client_context()
    with connect(broker.host, broker.tls_port, ssl_context=context) as conn:
        sub = conn.subscribe("/queue/tls.sync", ack="client-individual")
        conn.send("/queue/tls.sync", "over tls", receipt=True)
        message = sub.get(timeout=10)
        assert message is not None and message.text == "over tls"
        conn.ack(message, receipt=True)


async def test_our_trio_client_sends_and_receives_over_tls(broker: BrokerProcess, pki: Pki) -> None:
    context = pki.client_context()
    async with open_connection(broker.host, broker.tls_port, ssl_context=context) as conn:
        sub = await conn.subscribe("/topic/tls.trio")
        await conn.send("/topic/tls.trio", "over tls", receipt=True)
        message = await sub.get(timeout=10)
        assert message is not None and message.text == "over tls"


def test_the_sync_client_carries_a_heavy_two_way_load(broker: BrokerProcess, pki: Pki) -> None:
    """Two threads send large messages while the reader thread receives them on the same
    TLS connection: the socket's buffers fill both ways (OpenSSL's want-read and
    want-write), and no thread may be inside the SSL object with another."""
    body = b"x" * 64 * 1024
    per_thread = 150
    with connect(broker.host, broker.tls_port, ssl_context=pki.client_context()) as conn:
        sub = conn.subscribe("/queue/tls.load")

        def produce(name: str) -> None:
            for n in range(per_thread):
                conn.send("/queue/tls.load", body, headers={"n": f"{name}{n}"})

        threads = [threading.Thread(target=produce, args=(name,)) for name in "ab"]
        for thread in threads:
            thread.start()
        got: dict[str, list[int]] = {"a": [], "b": []}
        for _ in range(2 * per_thread):
            message = sub.get(timeout=30)
            assert message is not None and message.body == body
            got[message.headers["n"][0]].append(int(message.headers["n"][1:]))
        for thread in threads:
            thread.join(10)
        assert got == {"a": list(range(per_thread)), "b": list(range(per_thread))}


def test_the_plain_port_still_serves_beside_it(broker: BrokerProcess, pki: Pki) -> None:
    with (
        connect(broker.host, broker.port) as plain,
        connect(broker.host, broker.tls_port, ssl_context=pki.client_context()) as tls,
    ):
        sub = plain.subscribe("/queue/tls.across")
        tls.send("/queue/tls.across", "from TLS to plain", receipt=True)
        message = sub.get(timeout=10)
        assert message is not None and message.text == "from TLS to plain"


def test_a_server_certificate_of_another_ca_is_refused_by_our_clients(
    broker: BrokerProcess, pki: Pki
) -> None:
    stranger = ssl.create_default_context(cafile=str(pki.stranger_cert))
    with pytest.raises(ssl.SSLCertVerificationError):
        connect(broker.host, broker.tls_port, ssl_context=stranger)

    async def trio_client() -> None:
        async with open_connection(broker.host, broker.tls_port, ssl_context=stranger):
            pass

    with pytest.raises(ssl.SSLCertVerificationError):
        trio.run(trio_client)


# -- client certificates ------------------------------------------------------------------


def test_an_optional_client_certificate_is_checked_and_its_name_logged(
    fresh: BrokerProcess, pki: Pki
) -> None:
    broker = fresh
    with connect(broker.host, broker.tls_port, ssl_context=pki.client_context(certificate=True)):
        pass
    broker.wait_for_log(r"TLS from 127\.0\.0\.1:\d+: TLSv1\.[23], \S+, client certificate CN=alice")
    # One the CA did not sign is refused, even where none is required (TLS 1.3: the
    # client hears of it at its first read).
    context = pki.client_context()
    context.load_cert_chain(pki.stranger_cert, pki.stranger_key)
    with (
        from_address(broker, "127.0.0.3") as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        pytest.raises(ssl.SSLError, match="UNKNOWN_CA"),
    ):
        tls.recv(1)
    broker.wait_for_log(
        r"TLS handshake failed from 127\.0\.0\.3:\d+: \[SSL: CERTIFICATE_VERIFY_FAILED\]"
    )


def test_a_required_client_certificate(strict: BrokerProcess, pki: Pki) -> None:
    # Without one: TLS 1.3 lets the client finish its side of the handshake, so the
    # refusal (an alert) ends the connection at the client's first read.
    with pytest.raises(ConnectionClosed, match=r"(?i)certificate required"):
        connect(strict.host, strict.tls_port, ssl_context=pki.client_context())
    strict.wait_for_log(
        r"TLS handshake failed from 127\.0\.0\.1:\d+: \[SSL: PEER_DID_NOT_RETURN_A_CERTIFICATE\]"
    )
    without = stomp_py(strict, pki)
    without.connect(wait=False)
    assert refused_within(without, seconds=30)
    without.disconnect()
    # With one the CA signed: in, with our client and with stomp.py.
    with connect(
        strict.host, strict.tls_port, ssl_context=pki.client_context(certificate=True)
    ) as conn:
        sub = conn.subscribe("/queue/tls.strict")
        conn.send("/queue/tls.strict", "signed", receipt=True)
        message = sub.get(timeout=10)
        assert message is not None and message.text == "signed"
    conn = stomp_py(strict, pki, pki.client_cert)
    conn.connect(wait=True)
    assert conn.is_connected()
    conn.disconnect()


# -- what is refused ----------------------------------------------------------------------


def tls_1_1_context(pki: Pki) -> ssl.SSLContext:
    """A client context that offers TLS 1.0 and 1.1 only (OpenSSL 3 needs security level
    0 for them)."""
    context = pki.client_context()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TLSVersion.TLSv1_1 is
        context.minimum_version = ssl.TLSVersion.TLSv1
        context.maximum_version = ssl.TLSVersion.TLSv1_1
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    return context


def test_tls_1_1_is_refused(fresh: BrokerProcess, pki: Pki) -> None:
    broker = fresh
    # The control: this machine's OpenSSL can speak TLS 1.1 with a server that allows it,
    # so a refusal by the broker is the broker's.
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(pki.server_cert, pki.server_key)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        server.minimum_version = ssl.TLSVersion.TLSv1
    server.set_ciphers("DEFAULT:@SECLEVEL=0")
    with socket.create_server(("127.0.0.1", 0)) as listener:

        def serve_once() -> None:
            accepted, _ = listener.accept()
            with server.wrap_socket(accepted, server_side=True):
                pass

        thread = threading.Thread(target=serve_once)
        thread.start()
        with (
            socket.create_connection(listener.getsockname(), timeout=10) as raw,
            tls_1_1_context(pki).wrap_socket(raw, server_hostname="127.0.0.1") as control,
        ):
            assert control.version() == "TLSv1.1"
        thread.join(10)
    with from_address(broker, "127.0.0.4") as raw, pytest.raises(ssl.SSLError):
        tls_1_1_context(pki).wrap_socket(raw, server_hostname="127.0.0.1")
    broker.wait_for_log(
        r"TLS handshake failed from 127\.0\.0\.4:\d+: \[SSL: UNSUPPORTED_PROTOCOL\]"
    )
    # The next one, from another address, is only counted; the count is said at the
    # latest when the broker stops.
    with pytest.raises(ssl.SSLError, match="PROTOCOL_VERSION"):
        connect(broker.host, broker.tls_port, ssl_context=tls_1_1_context(pki))
    broker.stop_checked()
    assert "TLS handshake failed: … and 1 more like it from 127.0.0.1 in the last" in (
        broker.log_text()
    )


def test_a_client_that_says_nothing_is_dropped_after_connect_timeout(
    broker: BrokerProcess,
) -> None:
    with from_address(broker, "127.0.0.5") as sock:
        sock.settimeout(30)
        started = time.monotonic()
        assert sock.recv(1) == b""  # closed by the broker
        waited = time.monotonic() - started
        local = sock.getsockname()[1]
    assert CONNECT_TIMEOUT_MS / 1000 - 0.1 <= waited < 15, waited
    broker.wait_for_log(
        rf"TLS handshake not completed from 127\.0\.0\.5:{local}: none within "
        rf"{CONNECT_TIMEOUT_MS} ms \(stomp\.connect_timeout_ms\)"
    )


def test_plain_stomp_on_the_tls_port_is_dropped_and_the_broker_goes_on(
    fresh: BrokerProcess, pki: Pki
) -> None:
    broker = fresh
    gateways = gateway_pids(broker)
    ports = []
    for n in range(10, 14):
        with from_address(broker, f"127.0.0.{n}") as sock:
            ports.append(sock.getsockname()[1])
            sock.sendall(b"CONNECT\naccept-version:1.2\nhost:/\n\n\0")
            while sock.recv(4096):  # a TLS alert at most, then the end
                pass
    # The first is logged, the others counted (summed up at the latest when it stops).
    broker.wait_for_log(rf"TLS handshake failed from 127\.0\.0\.10:{ports[0]}: \[SSL: ")
    with connect(broker.host, broker.tls_port, ssl_context=pki.client_context()) as conn:
        conn.send("/queue/tls.after", "still here", receipt=True)
    assert gateway_pids(broker) == gateways  # none crashed and restarted
    broker.stop_checked()
    assert "TLS handshake failed: … and 3 more like it from 3 addresses (most from " in (
        broker.log_text()
    )


# -- start-up refusals --------------------------------------------------------------------


def serve(config: Path, data: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "mpbroker", "serve", "--port", "0", "--admin-port", "-1"]
    command += ["--config", str(config), "--data-dir", str(data)]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )


def refused(tmp_path: Path, config: str) -> str:
    """The one line a broker with `config` is refused with (exit code 2, nothing made)."""
    path = tmp_path / "broker.toml"
    path.write_text(config)
    result = serve(path, tmp_path / "data")
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert not (tmp_path / "data").exists()  # refused before anything
    return result.stderr.rstrip("\n")


def test_a_missing_key_file_is_refused_at_start(tmp_path: Path, pki: Pki) -> None:
    missing = tmp_path / "missing.key"
    config = tls_config(pki).replace(str(pki.server_key), str(missing))
    assert refused(tmp_path, config) == (
        f"mpbroker: config: stomp.tls_key_file = '{missing}': cannot read it: "
        "No such file or directory"
    )


def test_a_key_that_does_not_match_the_certificate_is_refused_at_start(
    tmp_path: Path, pki: Pki
) -> None:
    config = tls_config(pki).replace(str(pki.server_key), str(pki.client_key))
    assert refused(tmp_path, config) == (
        f"mpbroker: config: stomp.tls_key_file = '{pki.client_key}': does not match the "
        f"certificate of stomp.tls_cert_file = '{pki.server_cert}'"
    )


def test_an_encrypted_key_is_refused_at_start_without_a_prompt(tmp_path: Path, pki: Pki) -> None:
    config = tls_config(pki).replace(str(pki.server_key), str(pki.encrypted_key))
    line = refused(tmp_path, config)
    assert line.startswith(
        f"mpbroker: config: stomp.tls_key_file = '{pki.encrypted_key}': the key is encrypted "
        "with a passphrase"
    )
    assert PASSPHRASE.decode() not in line


def test_a_tls_port_without_a_certificate_is_refused_at_start(tmp_path: Path) -> None:
    assert refused(tmp_path, "[stomp]\ntls_port = 0\n") == (
        "mpbroker: config: stomp.tls_cert_file = '': required by stomp.tls_port = 0 "
        "(a PEM file; -1 = no TLS listener)"
    )
    assert refused(tmp_path, f'[stomp]\ntls_port = 0\ntls_cert_file = "{tmp_path}/c.pem"\n') == (
        "mpbroker: config: stomp.tls_key_file = '': required by stomp.tls_port = 0 "
        "(a PEM file; -1 = no TLS listener)"
    )


def test_a_required_client_certificate_without_a_ca_is_refused_at_start(
    tmp_path: Path, pki: Pki
) -> None:
    config = tls_config(pki, ca=False, required=True)
    assert refused(tmp_path, config).startswith(
        "mpbroker: config: stomp.tls_ca_file = '': required by stomp.tls_require_client_cert"
    )


def test_a_tls_port_in_use_is_named(tmp_path: Path, pki: Pki) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        path = tmp_path / "broker.toml"
        path.write_text(tls_config(pki).replace("tls_port = 0", f"tls_port = {port}"))
        result = serve(path, tmp_path / "data")
    # 1, not 2: the port may be free at the next try.
    assert result.returncode == 1, result.stderr
    assert (
        f"cannot start: cannot listen on 127.0.0.1:{port} (stomp.tls_port): Address already in use"
    ) in result.stderr
