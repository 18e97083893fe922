"""Ways of feeding bytes to a parser, after h11's test_io.py: whole, byte by byte, in two."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from mpbroker.stomp import Frame, FrameParser

ParserFactory = Callable[[], FrameParser]


def feed_whole(make: ParserFactory, data: bytes) -> tuple[list[Frame], FrameParser]:
    parser = make()
    return parser.feed(data), parser


def feed_bytewise(make: ParserFactory, data: bytes) -> tuple[list[Frame], FrameParser]:
    parser = make()
    frames: list[Frame] = []
    for i in range(len(data)):
        frames += parser.feed(data[i : i + 1])
    return frames, parser


def feed_split(make: ParserFactory, data: bytes) -> Iterator[tuple[int, list[Frame], FrameParser]]:
    """Every way of cutting ``data`` into two chunks (an empty chunk included)."""
    for cut in range(len(data) + 1):
        parser = make()
        frames = parser.feed(data[:cut])
        frames += parser.feed(data[cut:])
        yield cut, frames, parser


def assert_parses(make: ParserFactory, data: bytes, expected: list[Frame]) -> None:
    """``data`` gives ``expected`` however it is chunked, and leaves nothing buffered."""
    frames, parser = feed_whole(make, data)
    assert frames == expected
    assert parser.buffered_bytes == 0
    frames, parser = feed_bytewise(make, data)
    assert frames == expected
    assert parser.buffered_bytes == 0
    for cut, frames, parser in feed_split(make, data):
        assert frames == expected, f"split at byte {cut}"
        assert parser.buffered_bytes == 0, f"split at byte {cut}"
