"""The opening handshake of STOMP over WebSocket, decided with no socket: method, path,
upgrade headers, key, Origin (cross-site WebSocket hijacking) and subprotocol, and the HTTP
answers a refusal makes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpbroker.stomp import (
    WEBSOCKET_SUBPROTOCOLS,
    BadOrigin,
    HandshakeRefused,
    accept_request,
    parse_allowed_origins,
)
from mpbroker.stomp._websocket import (
    ForeignOrigin,
    MalformedRequest,
    NotWebSocket,
    UnknownPath,
    UnsupportedSubprotocol,
    WrongMethod,
    accept_token,
    choose_subprotocol,
    origin_allowed,
)

KEY = "dGhlIHNhbXBsZSBub25jZQ=="  # RFC 6455's example key
APP = parse_allowed_origins("https://app.example.com, http://intranet:8080")


def headers(**more: str) -> list[tuple[str, str]]:
    base = {
        "Host": "127.0.0.1:61614",
        "Upgrade": "websocket",
        "Connection": "keep-alive, Upgrade",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": KEY,
    }
    base.update({name.replace("_", "-"): value for name, value in more.items()})
    return [(name, value) for name, value in base.items() if value]


def refusal(method: str = "GET", target: str = "/ws", **more: str) -> HandshakeRefused:
    with pytest.raises(HandshakeRefused) as caught:
        accept_request(method, target, headers(**more), APP)
    return caught.value


def test_the_accept_token_is_rfc_6455s_example() -> None:
    assert accept_token(KEY) == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


def test_a_browsers_request_is_accepted_with_the_highest_stomp_version() -> None:
    accepted = accept_request(
        "GET",
        "/stomp",
        headers(Sec_WebSocket_Protocol="v10.stomp, v12.stomp", Origin="http://localhost:3000"),
        APP,
    )
    assert accepted.subprotocol == "v12.stomp"
    assert accepted.path == "/stomp"
    assert accepted.origin == "http://localhost:3000"
    response = accepted.response().decode()
    assert response.startswith("HTTP/1.1 101 Switching Protocols\r\n")
    assert "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n" in response
    assert "Sec-WebSocket-Protocol: v12.stomp\r\n" in response
    assert response.endswith("\r\n\r\n")


def test_no_subprotocol_offered_is_accepted_and_none_is_named() -> None:
    accepted = accept_request("GET", "/ws", headers(), None)
    assert accepted.subprotocol is None
    assert "Sec-WebSocket-Protocol" not in accepted.response().decode()


@pytest.mark.parametrize(
    ("offered", "chosen"),
    [
        (["v10.stomp"], "v10.stomp"),
        (["v11.stomp", "v10.stomp"], "v11.stomp"),
        (["mqtt", "stomp"], "stomp"),
        (["stomp", "v10.stomp"], "v10.stomp"),
        ([], None),
    ],
)
def test_the_subprotocol_is_the_best_stomp_one_offered(offered: list[str], chosen: str) -> None:
    assert choose_subprotocol(offered) == chosen


@given(st.lists(st.sampled_from([*WEBSOCKET_SUBPROTOCOLS, "mqtt", "wamp"]), min_size=1))
def test_any_offer_with_a_stomp_subprotocol_gets_the_first_of_the_preference(
    offered: list[str],
) -> None:
    stomp = [name for name in WEBSOCKET_SUBPROTOCOLS if name in offered]
    if stomp:
        assert choose_subprotocol(offered) == stomp[0]
    else:
        with pytest.raises(UnsupportedSubprotocol):
            choose_subprotocol(offered)


def test_subprotocols_none_of_them_stomp_are_a_400_naming_both_sides() -> None:
    refused = refusal(Sec_WebSocket_Protocol="mqtt, wamp.2.json")
    assert isinstance(refused, UnsupportedSubprotocol)
    assert refused.status == 400
    assert str(refused) == (
        "no supported subprotocol in 'mqtt, wamp.2.json': offer one of v12.stomp, v11.stomp, "
        "v10.stomp, stomp (or none)"
    )


def test_other_paths_are_a_404_naming_the_paths() -> None:
    refused = refusal(target="/admin?x=1")
    assert isinstance(refused, UnknownPath) and refused.status == 404
    assert str(refused) == "no such path '/admin': STOMP over WebSocket is at /stomp or /ws"


def test_other_methods_are_a_405() -> None:
    refused = refusal(method="POST")
    assert isinstance(refused, WrongMethod) and refused.status == 405
    assert b"\r\nAllow: GET\r\n" in refused.response()


@pytest.mark.parametrize(
    ("more", "missing"),
    [
        ({"Upgrade": ""}, "no 'Upgrade: websocket'"),
        ({"Connection": "keep-alive"}, "no 'Connection: Upgrade'"),
        ({"Sec_WebSocket_Version": "8"}, "Sec-WebSocket-Version is not 13"),
    ],
)
def test_a_plain_http_request_is_a_426(more: dict[str, str], missing: str) -> None:
    refused = refusal(**more)
    assert isinstance(refused, NotWebSocket) and refused.status == 426
    assert missing in str(refused)
    assert b"\r\nSec-WebSocket-Version: 13\r\n" in refused.response()


def test_a_bad_key_is_a_400() -> None:
    refused = refusal(Sec_WebSocket_Key="short")
    assert isinstance(refused, MalformedRequest) and refused.status == 400


def test_a_refusal_is_a_complete_http_answer_with_its_reason_as_the_body() -> None:
    response = refusal(target="/x").response()
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 404 Not Found\r\n")
    assert b"Content-Type: text/plain; charset=utf-8" in head
    assert f"Content-Length: {len(body)}".encode() in head
    assert b"Connection: close" in head
    assert body == b"no such path '/x': STOMP over WebSocket is at /stomp or /ws\n"


def test_a_foreign_origin_is_a_403_naming_it_and_the_setting() -> None:
    refused = refusal(Origin="https://evil.example")
    assert isinstance(refused, ForeignOrigin) and refused.status == 403
    assert "'https://evil.example'" in str(refused)
    assert "stomp.ws_allowed_origins" in str(refused)


@pytest.mark.parametrize(
    "origin",
    [
        None,  # not a browser
        "http://localhost:8080",
        "http://127.0.0.1:5000",
        "http://[::1]:3000",
        "https://LOCALHOST",
        "https://app.example.com",
        "https://app.example.com:443",  # the scheme's default port
        "HTTPS://App.Example.com/",
        "http://intranet:8080",
    ],
)
def test_origins_allowed(origin: str | None) -> None:
    assert origin_allowed(origin, APP)


@pytest.mark.parametrize(
    "origin",
    [
        "https://evil.example",
        "http://app.example.com",  # another scheme
        "https://app.example.com:8443",  # another port
        "https://app.example.com.evil.example",
        "http://intranet",  # port 80, not 8080
        "null",  # a file, a sandboxed frame
        "http://localhost.evil.example",
        "",
    ],
)
def test_origins_refused(origin: str) -> None:
    assert not origin_allowed(origin, APP)


def test_a_star_allows_any_origin() -> None:
    assert parse_allowed_origins("*") is None
    assert origin_allowed("https://evil.example", parse_allowed_origins(" * "))


def test_a_star_beside_origins_is_refused_rather_than_making_them_pointless() -> None:
    with pytest.raises(BadOrigin, match=r"'\*' \(any origin\) with other origins"):
        parse_allowed_origins("https://a.example, *")


def test_a_port_of_digits_other_than_ascii_is_no_port() -> None:
    assert not origin_allowed("https://app.example.com:\u0664\u0664\u0663", APP)
    with pytest.raises(BadOrigin):
        parse_allowed_origins("https://app.example.com:\u0664\u0664\u0663")


def test_a_query_string_is_refused_not_ignored() -> None:
    refused = refusal(target="/ws?token=secret&x=1")
    assert refused.status == 400
    assert str(refused) == (
        "query parameter 'token' not supported: /stomp and /ws take none "
        "(log in with CONNECT's login and passcode)"
    )
    assert refusal(target="/stomp?").status == 400


def test_two_origin_headers_are_refused() -> None:
    request = [*headers(), ("Origin", "http://localhost"), ("Origin", "https://evil.example")]
    with pytest.raises(MalformedRequest, match="more than one Origin header"):
        accept_request("GET", "/ws", request, APP)


@pytest.mark.parametrize(
    "entry",
    ["app.example.com", "https://app.example.com/path", "https://", "ftp//x", "http://h:99999"],
)
def test_an_allowed_origin_that_is_not_one_is_refused(entry: str) -> None:
    with pytest.raises(BadOrigin, match="is not an origin: write scheme://host"):
        parse_allowed_origins(entry)


@given(st.text(max_size=40))
def test_any_origin_header_is_judged_without_an_exception(origin: str) -> None:
    assert origin_allowed(origin, APP) in (True, False)
