"""FrameParser on well-formed input: every frame fed whole, byte by byte and split in two."""

from __future__ import annotations

import pytest

from mpbroker.stomp import (
    CLIENT_COMMANDS,
    HEARTBEAT_BYTES,
    SERVER_COMMANDS,
    Frame,
    FrameLimits,
    FrameParser,
    encode_frame,
)

from ._feeding import assert_parses, feed_bytewise, feed_whole

# (id, wire bytes, frames a broker-side 1.2 parser must produce)
CASES: list[tuple[str, bytes, list[Frame]]] = [
    ("no headers no body", b"DISCONNECT\n\n\0", [Frame("DISCONNECT")]),
    (
        "headers and body",
        b"SEND\ndestination:/queue/a\nreceipt:7\n\nhello\0",
        [Frame("SEND", {"destination": "/queue/a", "receipt": "7"}, b"hello")],
    ),
    (
        "CRLF line ends",
        b"SEND\r\ndestination:/queue/a\r\nreceipt:7\r\n\r\nhello\0",
        [Frame("SEND", {"destination": "/queue/a", "receipt": "7"}, b"hello")],
    ),
    (
        "mixed LF and CRLF",
        b"SEND\ndestination:/queue/a\r\nreceipt:7\n\r\nhi\0",
        [Frame("SEND", {"destination": "/queue/a", "receipt": "7"}, b"hi")],
    ),
    (
        "content-length body holding NULs",
        b"SEND\ndestination:/queue/a\ncontent-length:5\n\na\0b\0c\0",
        [Frame("SEND", {"destination": "/queue/a", "content-length": "5"}, b"a\0b\0c")],
    ),
    (
        "content-length zero",
        b"SEND\ncontent-length:0\n\n\0",
        [Frame("SEND", {"content-length": "0"})],
    ),
    (
        "content-length with leading zeros",
        b"SEND\ncontent-length:003\n\nabc\0",
        [Frame("SEND", {"content-length": "003"}, b"abc")],
    ),
    (
        "body without content-length runs to the first NUL",
        b"SEND\n\nline 1\nline 2\r\n\n\0",
        [Frame("SEND", {}, b"line 1\nline 2\r\n\n")],
    ),
    (
        "repeated header: the first wins",
        b"SEND\nfoo:1\nbar:2\nfoo:3\nfoo:4\n\n\0",
        [Frame("SEND", {"foo": "1", "bar": "2"})],
    ),
    (
        "repeated content-length: the first wins",
        b"SEND\ncontent-length:2\ncontent-length:5\n\nab\0",
        [Frame("SEND", {"content-length": "2"}, b"ab")],
    ),
    (
        "heart-beats before, between and after frames",
        b"\n\r\n\nBEGIN\ntransaction:t\n\n\0\n\n\r\nCOMMIT\ntransaction:t\n\n\0\r\n\n",
        [Frame("BEGIN", {"transaction": "t"}), Frame("COMMIT", {"transaction": "t"})],
    ),
    (
        "empty value and a value of colons",
        b"SEND\nempty:\nurl:tcp://host:61613\n\n\0",
        [Frame("SEND", {"empty": "", "url": "tcp://host:61613"})],
    ),
    (
        "whitespace in names and values is kept",
        b"SEND\n key : value \n\n\0",
        [Frame("SEND", {" key ": " value "})],
    ),
    (
        "UTF-8 headers",
        "SEND\ndestination:/queue/café\nπ:√2\n\n\0".encode(),
        [Frame("SEND", {"destination": "/queue/café", "π": "√2"})],
    ),
    (
        "1.2 escapes in names and values",
        b"SEND\nkey\\cname:a\\nb\\rc\\\\d\\ce\n\n\0",
        [Frame("SEND", {"key:name": "a\nb\rc\\d:e"})],
    ),
    (
        "CONNECT is never unescaped",
        b"CONNECT\naccept-version:1.2\nlogin:a\\nb\npasscode:x:y\\t\n\n\0",
        [Frame("CONNECT", {"accept-version": "1.2", "login": "a\\nb", "passcode": "x:y\\t"})],
    ),
    (
        "STOMP is never unescaped",
        b"STOMP\nhost:h\\c\n\n\0",
        [Frame("STOMP", {"host": "h\\c"})],
    ),
    (
        "several frames",
        b"SUBSCRIBE\nid:0\ndestination:/queue/a\nack:client\n\n\0"
        b"ACK\nid:m-1\n\n\0"
        b"UNSUBSCRIBE\nid:0\n\n\0",
        [
            Frame("SUBSCRIBE", {"id": "0", "destination": "/queue/a", "ack": "client"}),
            Frame("ACK", {"id": "m-1"}),
            Frame("UNSUBSCRIBE", {"id": "0"}),
        ],
    ),
]


@pytest.mark.parametrize(("data", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_frames_parse_however_they_are_chunked(data: bytes, expected: list[Frame]) -> None:
    assert_parses(FrameParser, data, expected)


@pytest.mark.parametrize(("data", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_trailing_bytes_of_the_next_frame_stay_buffered(data: bytes, expected: list[Frame]) -> None:
    trailing = b"SEND\ndestination:/queue/b\ncontent-length:10\n\nabc"
    for frames, parser in (
        feed_whole(FrameParser, data + trailing),
        feed_bytewise(FrameParser, data + trailing),
    ):
        assert frames == expected
        assert parser.buffered_bytes == len(trailing)
        assert parser.feed(b"defghij\0") == [
            Frame("SEND", {"destination": "/queue/b", "content-length": "10"}, b"abcdefghij")
        ]
        assert parser.buffered_bytes == 0


@pytest.mark.parametrize("command", sorted(CLIENT_COMMANDS))
def test_round_trip_every_client_command(command: str) -> None:
    headers = {"receipt": "r-1", "destination": "/queue/a", "x-custom": "ünïcode"}
    for body in (b"", b"payload\0with NUL"):
        frame = Frame(command, dict(headers), body)
        expected = Frame(command, dict(headers), body)
        if body:
            expected.headers["content-length"] = str(len(body))
        assert_parses(FrameParser, encode_frame(frame), [expected])


@pytest.mark.parametrize("command", sorted(SERVER_COMMANDS))
def test_round_trip_every_server_command(command: str) -> None:
    frame = Frame(command, {"message-id": "ID:1:2", "note": "a\nb"}, b"x" * 300)
    if command == "CONNECTED":
        frame.headers = {"version": "1.2", "server": "mpbroker/0.1.0", "session": "s:1"}
    expected = Frame(command, {**frame.headers, "content-length": "300"}, frame.body)

    def client_parser() -> FrameParser:
        return FrameParser(commands=SERVER_COMMANDS)

    assert_parses(client_parser, encode_frame(frame), [expected])


def test_heartbeat_alone_yields_nothing() -> None:
    parser = FrameParser()
    for _ in range(3):
        assert parser.feed(HEARTBEAT_BYTES) == []
        assert parser.feed(b"\r\n") == []
    assert parser.buffered_bytes == 0


def test_half_a_crlf_heartbeat_is_held_until_the_lf() -> None:
    parser = FrameParser()
    assert parser.feed(b"\r") == []
    assert parser.buffered_bytes == 1
    assert parser.feed(b"\nSEND\n\n\0") == [Frame("SEND")]
    assert parser.buffered_bytes == 0


def test_server_parser_refuses_nothing_it_accepts() -> None:
    # The command set decides: a client-side parser reads MESSAGE frames.
    parser = FrameParser(commands=SERVER_COMMANDS)
    assert parser.feed(b"MESSAGE\nsubscription:0\n\nhi\0") == [
        Frame("MESSAGE", {"subscription": "0"}, b"hi")
    ]


def test_connected_is_never_unescaped() -> None:
    parser = FrameParser(commands=SERVER_COMMANDS)
    assert parser.feed(b"CONNECTED\nserver:a\\b\n\n\0") == [Frame("CONNECTED", {"server": "a\\b"})]


@pytest.mark.parametrize(
    ("version", "raw", "value"),
    [
        ("1.2", b"a\\nb\\rc\\cd\\\\e", "a\nb\rc:d\\e"),
        ("1.1", b"a\\nb\\cd\\\\e", "a\nb:d\\e"),
        ("1.0", b"a\\nb\\rc\\cd\\\\e\\t\\", "a\\nb\\rc\\cd\\\\e\\t\\"),
    ],
)
def test_unescaping_follows_the_version(version: str, raw: bytes, value: str) -> None:
    parser = FrameParser(version=version)
    assert parser.feed(b"SEND\nkey:" + raw + b"\n\n\0") == [Frame("SEND", {"key": value})]


def test_version_can_change_between_feeds() -> None:
    parser = FrameParser()
    assert parser.feed(b"SEND\nk:a\\cb\n\n\0") == [Frame("SEND", {"k": "a:b"})]
    parser.version = "1.0"
    assert parser.version == "1.0"
    assert parser.feed(b"SEND\nk:a\\cb\\t\n\n\0") == [Frame("SEND", {"k": "a\\cb\\t"})]


@pytest.mark.parametrize("version", ["", "1.3", "2.0", "1"])
def test_unknown_versions_are_refused(version: str) -> None:
    with pytest.raises(ValueError, match="unsupported STOMP version"):
        FrameParser(version=version)
    parser = FrameParser()
    with pytest.raises(ValueError, match="unsupported STOMP version"):
        parser.version = version
    assert parser.version == "1.2"


def test_many_small_frames_in_one_chunk() -> None:
    one = b"SEND\ndestination:/queue/a\ncontent-type:text/plain\ncontent-length:3\n\nabc\0"
    frames = FrameParser().feed(one * 500)
    assert len(frames) == 500
    assert (
        frames[0]
        == frames[-1]
        == Frame(
            "SEND",
            {"destination": "/queue/a", "content-type": "text/plain", "content-length": "3"},
            b"abc",
        )
    )


@pytest.mark.parametrize("with_length", [True, False])
def test_frame_of_exactly_max_frame_bytes_is_accepted(with_length: bool) -> None:
    # "SEND\n" + header + "\n" + body + NUL == 200 bytes exactly.
    header = b"content-length:174\n" if with_length else b""
    body = b"x" * (200 - len(b"SEND\n\n\0") - len(header))
    data = b"SEND\n" + header + b"\n" + body + b"\0"
    assert len(data) == 200
    parser = FrameParser(FrameLimits(max_frame_bytes=200))
    assert [f.body for f in parser.feed(data)] == [body]


def test_a_large_body_trickling_in_is_not_rescanned() -> None:
    # One byte at a time through a 256 KiB body: linear work, so this is quick; a parser that
    # re-searched the whole buffer on every feed would take minutes.
    body = bytes(range(1, 256)) * 1024
    data = b"SEND\n\n" + body + b"\0"
    frames, parser = feed_bytewise(FrameParser, data)
    assert frames == [Frame("SEND", {}, body)]
    data = b"SEND\ncontent-length:%d\n\n" % len(body) + body + b"\0"
    frames, parser = feed_bytewise(FrameParser, data)
    assert frames == [Frame("SEND", {"content-length": str(len(body))}, body)]
    assert parser.buffered_bytes == 0


def test_buffered_bytes_counts_the_incomplete_frame() -> None:
    parser = FrameParser()
    assert parser.feed(b"SEND\nfoo:bar\n\nbo") == []
    assert parser.buffered_bytes == len(b"SEND\nfoo:bar\n\nbo")
    assert parser.feed(b"dy\0\n\nSE") == [Frame("SEND", {"foo": "bar"}, b"body")]
    assert parser.buffered_bytes == 2


def test_limits_are_exposed() -> None:
    limits = FrameLimits(max_frame_bytes=10)
    assert FrameParser(limits).limits is limits
    assert FrameParser().limits == FrameLimits()
