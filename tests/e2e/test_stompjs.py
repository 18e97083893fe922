"""The real stomp.js (`@stomp/stompjs`, its UMD bundle) in a headless Chromium, against a
broker's `stomp.ws_port` and `stomp.wss_port`: a page served from a loopback HTTP server
(its Origin is http://127.0.0.1:PORT, a local one) connects, subscribes with client
acknowledgements, publishes, receives, acknowledges, takes a binary body from a TCP client,
and disconnects. Over wss the browser is told to take the test CA's certificate
(`--ignore-certificate-errors`).

The bundle comes from the npm registry's tarball, checked against its pinned sha512 and
cached in pytest's cache directory (reruns do not download)."""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import io
import tarfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mpbroker.client import connect
from mpbroker.harness import BrokerProcess
from tests.browser import chromium, console_errors
from tests.security.test_tls import make_pki

pytestmark = pytest.mark.slow

STOMPJS_VERSION = "7.5.0"
STOMPJS_URL = f"https://registry.npmjs.org/@stomp/stompjs/-/stompjs-{STOMPJS_VERSION}.tgz"
# The registry's `dist.integrity` for that version.
STOMPJS_INTEGRITY = "sha512-xh3sdzEYH8M+krQGBOgj+U0BLBHd7ccTj8YM3mVxaULMTW/wx2QBWf448pilRiWZKjglhDmNILxM3W+j/Ch9uw=="
BUNDLE = "package/bundles/stomp.umd.min.js"
BINARY_BODY = bytes([0, 255, 16, 0, 200])

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>stomp.js</title><link rel="icon" href="data:,">
<script src="stomp.umd.min.js"></script></head>
<body><script>
window.results = {state: "starting", messages: [], binary: null, errors: [], version: null};
const results = window.results;
const params = new URLSearchParams(location.search);
const client = new StompJs.Client({
  brokerURL: params.get("broker"),
  reconnectDelay: 0,
  heartbeatIncoming: 1000,
  heartbeatOutgoing: 1000,
});
function check() {
  if (results.messages.length === 3 && results.binary !== null) {
    results.state = "received";
    client.deactivate().then(() => { results.state = "done"; });
  }
}
client.onConnect = (frame) => {
  results.state = "connected";
  results.version = frame.headers.version;
  results.subprotocol = client.webSocket.protocol;
  client.subscribe("/queue/stompjs", (message) => {
    results.messages.push(message.body);
    message.ack();
    check();
  }, {ack: "client-individual"});
  client.subscribe("/queue/stompjs.in", (message) => {
    results.binary = Array.from(message.binaryBody);
    message.ack();
    check();
  }, {ack: "client"});
  for (let n = 0; n < 3; n++) {
    client.publish({destination: "/queue/stompjs", body: "hello " + n});
  }
};
client.onStompError = (frame) => { results.errors.push("ERROR " + frame.headers.message); };
client.onWebSocketError = () => { results.errors.push("WebSocket error"); };
client.activate();
</script></body></html>
"""


def fetch_stompjs(cache_dir: Path) -> Path:
    """The tarball, downloaded once into `cache_dir` and checked against its integrity."""
    tarball = cache_dir / f"stompjs-{STOMPJS_VERSION}.tgz"
    if tarball.exists() and _integrity(tarball.read_bytes()) == STOMPJS_INTEGRITY:
        return tarball
    try:
        with urllib.request.urlopen(STOMPJS_URL, timeout=60) as response:
            data = response.read()
    except OSError as exc:
        pytest.fail(f"cannot fetch stomp.js from {STOMPJS_URL}: {exc}")
    got = _integrity(data)
    if got != STOMPJS_INTEGRITY:
        pytest.fail(f"{STOMPJS_URL}: integrity {got}, expected {STOMPJS_INTEGRITY}")
    tarball.write_bytes(data)
    return tarball


def _integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


@pytest.fixture(scope="module")
def site(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with the test page and stomp.js's bundle."""
    tarball = fetch_stompjs(request.config.cache.mkdir("stompjs"))
    root = tmp_path_factory.mktemp("site")
    with tarfile.open(fileobj=io.BytesIO(tarball.read_bytes()), mode="r:gz") as archive:
        member = archive.extractfile(BUNDLE)
        assert member is not None, f"{BUNDLE} is not in {tarball}"
        (root / "stomp.umd.min.js").write_bytes(member.read())
    (root / "index.html").write_text(PAGE, encoding="utf-8")
    return root


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def web_server(site: Path) -> Iterator[str]:
    """http://127.0.0.1:PORT serving `site`, in a thread, until the module ends."""
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    root = tmp_path_factory.mktemp("stompjs")
    pki = make_pki(root / "pki")
    config = "\n".join(
        [
            "[stomp]",
            "ws_port = 0",
            "wss_port = 0",
            f'tls_cert_file = "{pki.server_cert}"',
            f'tls_key_file = "{pki.server_key}"',
            "",
        ]
    )
    with BrokerProcess(gateways=2, config=config, data_dir=root / "data") as proc:
        yield proc


@pytest.mark.parametrize("scheme", ["ws", "wss"])
def test_stomp_js_in_chromium_connects_subscribes_sends_receives_and_acks(
    broker: BrokerProcess, web_server: str, scheme: str
) -> None:
    with connect(broker.host, broker.port) as tcp:
        # Waiting in the queue for the page's subscription: a body that is not UTF-8.
        tcp.send("/queue/stompjs.in", BINARY_BODY, receipt=True)
    port = broker.ws_port if scheme == "ws" else broker.wss_port
    arguments = ("--ignore-certificate-errors",) if scheme == "wss" else ()
    with chromium(arguments=arguments) as driver:
        driver.get(f"{web_server}/index.html?broker={scheme}://127.0.0.1:{port}/ws")
        deadline = time.monotonic() + 30
        results: dict[str, Any] = {}
        while time.monotonic() < deadline:
            results = driver.execute_script("return window.results")
            if results["state"] == "done" or results["errors"]:
                break
            time.sleep(0.1)
        assert results["errors"] == []
        assert results["state"] == "done", results
        assert results["version"] == "1.2"
        assert results["subprotocol"] == "v12.stomp"
        assert sorted(results["messages"]) == ["hello 0", "hello 1", "hello 2"]
        assert bytes(results["binary"]) == BINARY_BODY
        assert console_errors(driver) == []
    # Acknowledged: nothing comes back to another consumer.
    with connect(broker.host, broker.port) as tcp:
        sub = tcp.subscribe("/queue/stompjs")
        other = tcp.subscribe("/queue/stompjs.in")
        assert sub.get(timeout=1) is None and other.get(timeout=0.2) is None
