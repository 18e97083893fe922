"""Message-body compression codecs compared (a measurement script, not a test).

    .venv/bin/python -m bench.compression [--quick]

For bodies of 1 KiB to 1 MiB, two kinds of data: JSON-ish text (order records, the kind of
body a broker carries and the kind compression is for) and random bytes (the incompressible
case: what does trying cost when it does not pay?). Per codec: compress and decompress
throughput in MB/s of ORIGINAL bytes (best of several rounds; the gateway compresses once
per SEND and decompresses once per delivered message) and the ratio original/compressed.

Codecs: zlib levels 1 and 6 (standard library), zstandard levels 1 and 3 (with the frame
checksum, as mpbroker.compression writes it) and, when installed, lz4 (frame format, default
level; not a dependency of mpbroker: `pip install lz4` to see it).
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zstandard

KIB = 1024
SIZES = (1 * KIB, 4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, 1024 * KIB)
# Bytes each measurement round processes at least (a 1 KiB body is compressed 4096 times),
# so timer resolution and per-call overhead are both visible but not dominant.
ROUND_BYTES = 4 * 1024 * KIB
ROUNDS = 5

# Words the JSON values are drawn from: realistic bodies repeat keys and a vocabulary.
_VOCABULARY = (
    "pending shipped delivered cancelled returned standard express overnight warehouse "
    "berlin paris lisbon oslo madrid vienna prague dublin widget gadget sprocket bracket "
    "bolt washer hinge panel cable adapter sensor valve pump filter"
)
_WORDS = _VOCABULARY.split()


@dataclass(frozen=True, slots=True)
class Codec:
    name: str
    compress: Callable[[bytes], bytes]
    decompress: Callable[[bytes], bytes]


def codecs() -> list[Codec]:
    """The codecs to compare: zlib and zstandard, and lz4 when importable."""
    found = [
        Codec("zlib-1", lambda b: zlib.compress(b, 1), zlib.decompress),
        Codec("zlib-6", lambda b: zlib.compress(b, 6), zlib.decompress),
    ]
    decompressor = zstandard.ZstdDecompressor()
    for level in (1, 3):
        compressor = zstandard.ZstdCompressor(level=level, write_checksum=True)
        found.append(Codec(f"zstd-{level}", compressor.compress, decompressor.decompress))
    try:
        lz4_frame: Any = importlib.import_module("lz4.frame")
    except ImportError:
        print("lz4 not installed (pip install lz4): skipped")
    else:
        found.append(Codec("lz4", lz4_frame.compress, lz4_frame.decompress))
    return found


def json_body(size: int, rnd: random.Random) -> bytes:
    """JSON order records, cut to `size` bytes: repeated keys, varied values."""
    parts: list[bytes] = []
    total = 0
    n = 0
    while total < size:
        n += 1
        record = {
            "order_id": f"ORD-{rnd.randrange(10**9):09d}",
            "customer": {
                "id": rnd.randrange(10**6),
                "name": f"{rnd.choice(_WORDS).title()} {rnd.choice(_WORDS).title()}",
                "city": rnd.choice(_WORDS),
            },
            "status": rnd.choice(_WORDS),
            "created": f"2026-{rnd.randint(1, 12):02d}-{rnd.randint(1, 28):02d}T"
            f"{rnd.randint(0, 23):02d}:{rnd.randint(0, 59):02d}:{rnd.randint(0, 59):02d}Z",
            "items": [
                {
                    "sku": f"{rnd.choice(_WORDS)[:3].upper()}-{rnd.randrange(10**5):05d}",
                    "qty": rnd.randint(1, 20),
                    "price": round(rnd.uniform(0.5, 500), 2),
                }
                for _ in range(rnd.randint(1, 4))
            ],
            "note": " ".join(rnd.choice(_WORDS) for _ in range(rnd.randint(0, 8))),
        }
        line = json.dumps(record).encode() + b",\n"
        parts.append(line)
        total += len(line)
    return (b"[" + b"".join(parts))[:size]


def _best_rate(work: Callable[[bytes], bytes], data: bytes, rounds: int) -> float:
    """MB/s of `data` bytes through `work`, best of `rounds` rounds."""
    calls = max(1, ROUND_BYTES // len(data))
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            work(data)
        best = min(best, time.perf_counter() - start)
    return calls * len(data) / best / 1e6


def measure(codec: Codec, data: bytes, rounds: int) -> tuple[float, float, float]:
    """(compress MB/s, decompress MB/s, ratio original/compressed) for one body."""
    packed = codec.compress(data)
    if codec.decompress(packed) != data:
        raise AssertionError(f"{codec.name}: round trip changed the data")
    return (
        _best_rate(codec.compress, data, rounds),
        _best_rate(codec.decompress, packed, rounds) * len(data) / len(packed),
        len(data) / len(packed),
    )


def _size_name(size: int) -> str:
    return f"{size // KIB} KiB" if size < 1024 * KIB else f"{size // (1024 * KIB)} MiB"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.compression", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one round per measurement")
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else ROUNDS
    rnd = random.Random(42)
    all_codecs = codecs()
    for kind, make in (
        ("JSON-ish text", lambda size: json_body(size, rnd)),
        ("random bytes", rnd.randbytes),
    ):
        print(
            f"\n{kind}: compress MB/s / decompress MB/s / ratio (original MB/s, best of {rounds})"
        )
        print(f"{'size':>8} " + " ".join(f"{c.name:>22}" for c in all_codecs))
        for size in SIZES:
            data = make(size)
            cells = []
            for codec in all_codecs:
                comp, decomp, ratio = measure(codec, data, rounds)
                cells.append(f"{comp:>6.0f} / {decomp:>6.0f} / {ratio:>4.2f}")
            print(f"{_size_name(size):>8} " + " ".join(f"{c:>22}" for c in cells))


if __name__ == "__main__":
    main()
