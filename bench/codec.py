"""Throughput of the STOMP codec (a measurement script, not a test).

Run: .venv/bin/python -m bench.codec
"""

from __future__ import annotations

import argparse
import time

from mpbroker.stomp import SERVER_COMMANDS, Frame, FrameParser, encode_frame

FRAMES = 100_000
CHUNK = 64 * 1024


def bench_parse() -> float:
    frame = (
        b"SEND\ndestination:/queue/a\ncontent-type:text/plain\ncontent-length:100\n\n"
        + b"x" * 100
        + b"\0"
    )
    stream = frame * FRAMES
    chunks = [stream[i : i + CHUNK] for i in range(0, len(stream), CHUNK)]
    best = 0.0
    for _ in range(5):
        parser = FrameParser()
        count = 0
        start = time.perf_counter()
        for chunk in chunks:
            count += len(parser.feed(chunk))
        elapsed = time.perf_counter() - start
        assert count == FRAMES
        best = max(best, FRAMES / elapsed)
    return best


def bench_encode(headers: dict[str, str]) -> float:
    frame = Frame("MESSAGE", headers, b"x" * 100)
    best = 0.0
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(FRAMES):
            encode_frame(frame)
        best = max(best, FRAMES / (time.perf_counter() - start))
    return best


def bench_parse_messages() -> float:
    frame = encode_frame(
        Frame(
            "MESSAGE",
            {
                "subscription": "0",
                "message-id": "7a1f-000000001",
                "destination": "/queue/a",
                "content-type": "text/plain",
            },
            b"x" * 100,
        )
    )
    stream = frame * FRAMES
    chunks = [stream[i : i + CHUNK] for i in range(0, len(stream), CHUNK)]
    parser = FrameParser(commands=SERVER_COMMANDS)
    start = time.perf_counter()
    count = sum(len(parser.feed(chunk)) for chunk in chunks)
    assert count == FRAMES
    return FRAMES / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(
        prog="python -m bench.codec",
        description="Frames/s the STOMP codec parses and encodes (no options).",
    ).parse_args(argv)
    plain = {
        "subscription": "0",
        "message-id": "7a1f-000000001",
        "destination": "/queue/a",
        "content-type": "text/plain",
    }
    colons = {**plain, "message-id": "ID:host-1234-1:1:1:1"}
    print(f"parse SEND (100-byte body, 64 KiB chunks): {bench_parse():,.0f} frames/s")
    print(f"parse MESSAGE (client side):               {bench_parse_messages():,.0f} frames/s")
    print(f"encode MESSAGE, nothing to escape:         {bench_encode(plain):,.0f} frames/s")
    print(f"encode MESSAGE, a colon in message-id:     {bench_encode(colons):,.0f} frames/s")


if __name__ == "__main__":
    main()
