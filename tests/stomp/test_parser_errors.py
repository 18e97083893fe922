"""FrameParser on bad input: the right error, with its fields and a message naming them."""

from __future__ import annotations

import pytest

from mpbroker.stomp import (
    SERVER_COMMANDS,
    BadHeaderEscape,
    Frame,
    FrameLimits,
    FrameParser,
    FrameTooLarge,
    HeaderTooLong,
    MalformedFrame,
    ProtocolError,
    TooManyHeaders,
    UnknownCommand,
)

from ._feeding import feed_bytewise, feed_whole

SMALL = FrameLimits(max_frame_bytes=200, max_headers=3, max_header_bytes=16, max_command_bytes=12)


def parse_error(
    data: bytes, limits: FrameLimits | None = None, version: str = "1.2"
) -> ProtocolError:
    """The error ``data`` raises fed whole; fed byte by byte it must raise the same one."""

    def make() -> FrameParser:
        return FrameParser(limits or FrameLimits(), version=version)

    with pytest.raises(ProtocolError) as whole:
        feed_whole(make, data)
    with pytest.raises(ProtocolError) as bytewise:
        feed_bytewise(make, data)
    assert type(bytewise.value) is type(whole.value)
    return whole.value


# --- commands -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "command"),
    [
        (b"FOO\n\n\0", "FOO"),
        (b"send\n\n\0", "send"),  # commands are case-sensitive
        (b"MESSAGE\n\n\0", "MESSAGE"),  # a server frame sent to the server
        (b"GET / HTTP/1.1\r\nHost: example\r\n\r\n", "GET / HTTP/1.1"),
        (b" SEND\n\n\0", " SEND"),
        (b"\rSEND\n\n\0", "\rSEND"),
    ],
)
def test_unknown_command(data: bytes, command: str) -> None:
    error = parse_error(data)
    assert isinstance(error, UnknownCommand)
    assert error.command == command
    assert str(error) == f"unknown command {command!r}"


def test_unknown_command_is_refused_before_the_head_ends() -> None:
    parser = FrameParser()
    with pytest.raises(UnknownCommand):
        parser.feed(b"HELO\nfoo:bar\n")


def test_client_side_parser_refuses_client_commands() -> None:
    with pytest.raises(UnknownCommand) as info:
        FrameParser(commands=SERVER_COMMANDS).feed(b"SEND\n\n\0")
    assert info.value.command == "SEND"


def test_overlong_command_line() -> None:
    error = parse_error(b"X" * 20 + b"\n\n\0", SMALL)
    assert isinstance(error, MalformedFrame)
    assert str(error) == "malformed frame: command line of 20 bytes exceeds max_command_bytes 12"


def test_overlong_command_line_is_refused_without_waiting_for_its_end() -> None:
    parser = FrameParser(SMALL)
    assert parser.feed(b"X" * 13) == []  # may still be 12 bytes and a CR
    with pytest.raises(MalformedFrame) as info:
        parser.feed(b"X")
    assert "command line of at least 14 bytes exceeds max_command_bytes 12" in str(info.value)


def test_long_unknown_command_is_shortened_in_the_message() -> None:
    error = parse_error(b"Y" * 500 + b"\n\n\0")
    assert isinstance(error, UnknownCommand)
    assert error.command == "Y" * 500
    assert len(str(error)) < 100


# --- header lines ---------------------------------------------------------------------------


@pytest.mark.parametrize("line", [b"no-colon", b"   ", b"\t"])
def test_header_line_without_colon(line: bytes) -> None:
    error = parse_error(b"SEND\nok:1\n" + line + b"\nok:2\n\n\0")
    assert isinstance(error, MalformedFrame)
    assert error.reason == f"header line {line.decode()!r} has no ':'"


def test_header_with_empty_name() -> None:
    error = parse_error(b"SEND\n:value\n\n\0")
    assert isinstance(error, MalformedFrame)
    assert error.reason == "header line ':value' has an empty name"


@pytest.mark.parametrize(
    "head",
    [b"SEND\nname:caf\xe9\n", b"SEND\nna\xffme:x\n", b"SEND\nx:\xc3\n"],
)
def test_header_that_is_not_utf8(head: bytes) -> None:
    error = parse_error(head + b"\n\0")
    assert isinstance(error, MalformedFrame)
    assert "not valid UTF-8" in error.reason
    assert "byte 0x" in error.reason


def test_command_that_is_not_utf8_is_an_unknown_command() -> None:
    error = parse_error(b"SE\xffND\n\n\0")
    assert isinstance(error, UnknownCommand)
    assert error.command == "SE\ufffdND"


def test_too_many_headers() -> None:
    assert FrameParser(SMALL).feed(b"SEND\na:1\nb:2\nc:3\n\n\0")  # exactly the limit
    error = parse_error(b"SEND\na:1\nb:2\nc:3\nd:4\n\n\0", SMALL)
    assert isinstance(error, TooManyHeaders)
    assert (error.count, error.limit) == (4, 3)
    assert str(error) == "frame with 4 headers exceeds max_headers 3"


def test_repeated_headers_count_against_the_limit() -> None:
    error = parse_error(b"SEND\na:1\na:1\na:1\na:1\n\n\0", SMALL)
    assert isinstance(error, TooManyHeaders)


def test_header_line_too_long() -> None:
    # 16 bytes is the limit; the CR of a CRLF does not count.
    assert FrameParser(SMALL).feed(b"SEND\n" + b"k:" + b"v" * 14 + b"\r\n\n\0")
    error = parse_error(b"SEND\n" + b"k:" + b"v" * 15 + b"\n\n\0", SMALL)
    assert isinstance(error, HeaderTooLong)
    assert (error.size, error.limit, error.at_least) == (17, 16, False)
    assert str(error) == "header line of 17 bytes exceeds max_header_bytes 16"


def test_header_line_too_long_is_refused_without_waiting_for_its_end() -> None:
    parser = FrameParser(SMALL)
    assert parser.feed(b"SEND\nk:" + b"v" * 15) == []  # 17 bytes: may be 16 and a CR
    with pytest.raises(HeaderTooLong) as info:
        parser.feed(b"v")
    assert (info.value.size, info.value.limit, info.value.at_least) == (18, 16, True)
    assert str(info.value) == "header line of at least 18 bytes exceeds max_header_bytes 16"


# --- escapes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "value", "sequence"),
    [
        ("1.2", b"a\\tb", "\\t"),
        ("1.2", b"trailing\\", "\\"),
        ("1.2", b"\\x41", "\\x"),
        ("1.2", b"\\C", "\\C"),
        ("1.1", b"a\\rb", "\\r"),
        ("1.1", b"\\t", "\\t"),
    ],
)
def test_undefined_escape_is_fatal(version: str, value: bytes, sequence: str) -> None:
    error = parse_error(b"SEND\nkey:" + value + b"\n\n\0", version=version)
    assert isinstance(error, BadHeaderEscape)
    assert error.sequence == sequence
    assert error.version == version
    assert f"'{sequence}'" in str(error)
    assert f"STOMP {version}" in str(error)


def test_undefined_escape_in_a_header_name_is_fatal() -> None:
    error = parse_error(b"SEND\nke\\ty:v\n\n\0")
    assert isinstance(error, BadHeaderEscape)
    assert error.sequence == "\\t"


def test_undefined_escape_in_a_repeated_header_is_still_fatal() -> None:
    error = parse_error(b"SEND\nkey:v\nkey:\\t\n\n\0")
    assert isinstance(error, BadHeaderEscape)


# --- content-length and the body ------------------------------------------------------------


@pytest.mark.parametrize("value", ["abc", "-1", "+5", " 5", "5 ", "1.0", "", "0x10", "\u0663"])
def test_bad_content_length(value: str) -> None:
    error = parse_error(f"SEND\ncontent-length:{value}\n\nabc\0".encode())
    assert isinstance(error, MalformedFrame)
    assert error.reason == f"content-length {value!r} is not a non-negative integer"


def test_body_longer_than_content_length() -> None:
    error = parse_error(b"SEND\ncontent-length:2\n\nabc\0")
    assert isinstance(error, MalformedFrame)
    assert "body longer than content-length 2" in error.reason
    assert "0x63" in error.reason  # the 'c' found where the NUL should be


# --- frame size -----------------------------------------------------------------------------


def test_content_length_over_the_limit_is_refused_before_the_body() -> None:
    parser = FrameParser(FrameLimits(max_frame_bytes=200))
    head = b"SEND\ncontent-length:1000\n\n"
    with pytest.raises(FrameTooLarge) as info:
        parser.feed(head)
    size = len(head) + 1000 + 1
    assert (info.value.size, info.value.limit, info.value.at_least) == (size, 200, False)
    assert str(info.value) == f"frame of {size} bytes exceeds max_frame_bytes 200"


def test_absurd_content_length_is_refused() -> None:
    error = parse_error(b"SEND\ncontent-length:" + b"9" * 5000 + b"\n\n\0")
    assert isinstance(error, FrameTooLarge)
    assert error.at_least
    assert error.size == 10**18
    assert "exceeds max_frame_bytes 1048576" in str(error)


def test_leading_zeros_do_not_make_a_content_length_absurd() -> None:
    parser = FrameParser()
    data = b"SEND\ncontent-length:" + b"0" * 100 + b"3\n\nabc\0"
    assert [f.body for f in parser.feed(data)] == [b"abc"]


def test_body_without_content_length_is_refused_once_past_the_limit() -> None:
    parser = FrameParser(SMALL)
    assert parser.feed(b"SEND\n\n" + b"x" * 194) == []  # 200 bytes buffered, NUL may be next
    with pytest.raises(FrameTooLarge) as info:
        parser.feed(b"x")
    assert (info.value.size, info.value.limit, info.value.at_least) == (201, 200, True)
    assert str(info.value) == "frame of at least 201 bytes exceeds max_frame_bytes 200"


def test_complete_frame_over_the_limit_reports_its_size() -> None:
    data = b"SEND\n\n" + b"x" * 195 + b"\0"
    error = parse_error(data, SMALL)
    assert isinstance(error, FrameTooLarge)
    # Whole, the parser sees the NUL and knows the exact size; byte by byte, only a bound.
    assert (error.size, error.limit, error.at_least) == (202, 200, False)


def test_head_over_the_limit_is_refused_before_it_ends() -> None:
    limits = FrameLimits(max_frame_bytes=100)
    parser = FrameParser(limits)
    with pytest.raises(FrameTooLarge) as info:
        parser.feed(b"SEND\n" + b"h:v\n" * 30)
    assert info.value.at_least
    assert info.value.size == 125


def test_huge_stream_is_refused_as_soon_as_it_passes_the_limit() -> None:
    # Default limits, 64 KiB reads: the 17th read takes the buffer past 1 MiB and is refused;
    # the parser never holds 100 MB waiting for a NUL.
    parser = FrameParser()
    chunk = b"x" * (64 * 1024)
    assert parser.feed(b"SEND\n\n" + chunk[6:]) == []
    for _ in range(15):
        assert parser.feed(chunk) == []
    assert parser.buffered_bytes == 1 << 20
    with pytest.raises(FrameTooLarge):
        parser.feed(chunk)


def test_one_huge_read_is_refused_at_once() -> None:
    with pytest.raises(FrameTooLarge) as info:
        FrameParser().feed(b"SEND\n\n" + b"x" * (8 << 20))
    assert info.value.size == (8 << 20) + 6


# --- after an error -------------------------------------------------------------------------


def test_parser_stays_broken_after_an_error() -> None:
    parser = FrameParser()
    with pytest.raises(UnknownCommand) as first:
        parser.feed(b"SEND\n\n\0BOGUS\n\n\0SEND\n\n\0")
    assert parser.buffered_bytes == 0  # the buffer is released
    for data in (b"", b"SEND\n\n\0", b"\n"):
        with pytest.raises(UnknownCommand) as again:
            parser.feed(data)
        assert again.value is first.value
        assert str(again.value) == "unknown command 'BOGUS'"


def test_error_in_a_later_feed_breaks_the_parser_too() -> None:
    parser = FrameParser()
    assert parser.feed(b"SEND\n\n\0SEND\nkey:\\") == [Frame("SEND")]
    with pytest.raises(BadHeaderEscape) as first:
        parser.feed(b"t\n\n\0")
    with pytest.raises(BadHeaderEscape) as again:
        parser.feed(b"SEND\n\n\0")
    assert again.value is first.value
