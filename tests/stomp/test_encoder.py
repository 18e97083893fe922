"""encode_frame: exact bytes, content-length, escaping per version, refusals."""

from __future__ import annotations

import pytest

from mpbroker.stomp import Frame, encode_frame, frame_bytes, plain_header_text


def test_frame_without_headers_or_body() -> None:
    assert encode_frame(Frame("DISCONNECT")) == b"DISCONNECT\n\n\0"


def test_headers_in_dict_order_and_content_length_added_last() -> None:
    frame = Frame("MESSAGE", {"subscription": "0", "destination": "/queue/a"}, b"hi")
    assert encode_frame(frame) == (
        b"MESSAGE\nsubscription:0\ndestination:/queue/a\ncontent-length:2\n\nhi\0"
    )
    assert frame.headers == {"subscription": "0", "destination": "/queue/a"}  # not mutated


def test_body_without_headers_gets_content_length() -> None:
    assert encode_frame(Frame("SEND", {}, b"a\0b")) == b"SEND\ncontent-length:3\n\na\0b\0"


def test_empty_body_gets_no_content_length() -> None:
    assert encode_frame(Frame("RECEIPT", {"receipt-id": "7"})) == b"RECEIPT\nreceipt-id:7\n\n\0"


@pytest.mark.parametrize(("length", "body"), [("2", b"hi"), ("0", b""), ("002", b"hi")])
def test_given_content_length_is_kept_where_it_is(length: str, body: bytes) -> None:
    frame = Frame("SEND", {"content-length": length, "destination": "/q"}, body)
    assert encode_frame(frame) == (
        f"SEND\ncontent-length:{length}\ndestination:/q\n\n".encode() + body + b"\0"
    )


@pytest.mark.parametrize(
    ("length", "body"), [("3", b"hi"), ("1", b""), ("x", b"hi"), ("", b""), ("9" * 5000, b"hi")]
)
def test_content_length_that_disagrees_with_the_body_is_refused(length: str, body: bytes) -> None:
    with pytest.raises(ValueError, match="does not match the") as info:
        encode_frame(Frame("SEND", {"content-length": length}, body))
    assert f"{len(body)}-byte body" in str(info.value)


def test_utf8_headers() -> None:
    frame = Frame("MESSAGE", {"destination": "/queue/café"})
    assert encode_frame(frame) == "MESSAGE\ndestination:/queue/café\n\n\0".encode()


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("1.2", b"k\\cey:a\\nb\\rc\\cd\\\\e"),
        ("1.1", b"k\\cey:a\\nb c\\cd\\\\e"),
    ],
)
def test_escaping_follows_the_version(version: str, expected: bytes) -> None:
    value = "a\nb\rc:d\\e" if version == "1.2" else "a\nb c:d\\e"
    frame = Frame("MESSAGE", {"k:ey": value})
    assert encode_frame(frame, version) == b"MESSAGE\n" + expected + b"\n\n\0"


def test_version_1_0_escapes_nothing() -> None:
    frame = Frame("MESSAGE", {"url": "tcp://h:1", "path": "C:\\temp"})
    assert encode_frame(frame, "1.0") == b"MESSAGE\nurl:tcp://h:1\npath:C:\\temp\n\n\0"


@pytest.mark.parametrize("command", ["CONNECT", "STOMP", "CONNECTED"])
def test_connect_frames_are_never_escaped(command: str) -> None:
    frame = Frame(command, {"login": "a:b", "passcode": "c\\d"})
    assert encode_frame(frame) == f"{command}\nlogin:a:b\npasscode:c\\d\n\n\0".encode()


@pytest.mark.parametrize(
    ("command", "version", "headers", "message"),
    [
        ("MESSAGE", "1.0", {"k": "a\nb"}, "CR or LF"),
        ("MESSAGE", "1.0", {"k": "a\rb"}, "CR or LF"),
        ("MESSAGE", "1.0", {"k\n": "v"}, "CR or LF"),
        ("MESSAGE", "1.0", {"k:x": "v"}, "colon"),
        ("MESSAGE", "1.1", {"k": "a\rb"}, "CR or LF"),
        ("MESSAGE", "1.1", {"k\r": "v"}, "CR or LF"),
        ("CONNECTED", "1.2", {"server": "a\nb"}, "CR or LF"),
        ("CONNECT", "1.2", {"lo:gin": "x"}, "colon"),
        ("MESSAGE", "1.2", {"": "v"}, "empty name"),
        ("CONNECT", "1.0", {"": "v"}, "empty name"),
    ],
)
def test_headers_that_cannot_be_written_are_refused(
    command: str, version: str, headers: dict[str, str], message: str
) -> None:
    # Written raw they would split the line: one client injecting headers into another's frame.
    with pytest.raises(ValueError, match=message):
        encode_frame(Frame(command, headers), version)


def test_header_injection_attempt_is_escaped_in_1_2() -> None:
    frame = Frame("MESSAGE", {"note": "x\n\nfake body\0"})
    assert encode_frame(frame) == b"MESSAGE\nnote:x\\n\\nfake body\0\n\n\0"


@pytest.mark.parametrize("version", ["", "1.3", "2"])
def test_unknown_version_is_refused(version: str) -> None:
    with pytest.raises(ValueError, match="unsupported STOMP version"):
        encode_frame(Frame("SEND"), version)


def test_large_body_is_copied_once_into_the_output() -> None:
    body = b"\xab" * (1 << 20)
    data = encode_frame(Frame("SEND", {"destination": "/q"}, body))
    assert data.endswith(body + b"\0")
    assert data.startswith(b"SEND\ndestination:/q\ncontent-length:1048576\n\n")


def test_plain_header_text_joins_lines_nothing_needs_escaping_in() -> None:
    assert plain_header_text(["a:1", "b:two words", "c:"]) == "a:1\nb:two words\nc:"


@pytest.mark.parametrize("value", ["x:y", "x\ny", "x\ry", "x\\y"])
def test_plain_header_text_gives_up_on_what_some_version_escapes(value: str) -> None:
    # A colon in a value, a line break or a backslash: the caller escapes (or refuses).
    assert plain_header_text(["a:1", f"b:{value}"]) is None


@pytest.mark.parametrize("size", [0, 100, 4095, 4096, 1 << 16])
def test_frame_bytes_is_head_body_and_nul(size: int) -> None:
    body = b"\x01" * size
    assert frame_bytes("SEND\n\n", body) == b"SEND\n\n" + body + b"\0"
