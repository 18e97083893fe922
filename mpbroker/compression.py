"""Message-body compression (WebLogic's "message compression"): pure functions, bytes in and out.

The gateway compresses a large body once, at SEND; the compressed body is what travels on the
rings, what the stores keep and what limits count. `Message.encoding` names the codec ("" for
a body kept as sent), and the gateway decompresses once per delivered message, so consumers
get the original bytes. A stored body is decoded by its own `encoding`, whatever the codec
setting is now, so changing `[compression] codec` never strands stored messages.

Codecs (measured with `python -m bench.compression`; docs/benchmarks.md, "Compression codecs"):

- "zstd": Zstandard level 1 with its frame checksum, the default. On JSON-ish bodies of
  16 KiB-1 MiB it compresses at 550-850 MB/s (3-11x zlib level 6) and decompresses at
  1.6-2.2 GB/s (1.6-5x zlib), with a ratio (3.8-4.4) between zlib's levels 1 and 6; random
  bytes cost it almost nothing to try (~9 GB/s).
- "zlib": zlib level 6 (gzip's and WebLogic's GZIP_DEFAULT_COMPRESSION): 5-11 % smaller
  than zstd, for up to 11x the CPU per SEND.
"""

from __future__ import annotations

import zlib
from typing import Final

import zstandard

__all__ = ["CODECS", "MAX_INFLATED_BYTES", "CorruptBody", "compress", "decompress"]

CODECS: Final = ("zstd", "zlib")
ZSTD_LEVEL: Final = 1
ZLIB_LEVEL: Final = 6
# A body a stored frame header claims to inflate to beyond this is taken as corrupt, so a
# damaged header cannot make the gateway allocate terabytes. Far above any STOMP frame limit
# in use (ours defaults to 1 MiB, ActiveMQ's to 100 MiB).
MAX_INFLATED_BYTES: Final = 1 << 30

# zstandard's (de)compressor objects are reusable but not thread-safe; each process uses
# them from one thread (the gateway's trio loop).
# The checksum (4 bytes) makes a damaged stored body fail to decompress instead of yielding
# wrong bytes; zlib carries an Adler-32 of its own.
_zstd_compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True)
_zstd_decompressor = zstandard.ZstdDecompressor()


class CorruptBody(ValueError):
    """A compressed body that cannot be decompressed (a damaged store, or an unknown codec)."""

    def __init__(self, encoding: str, reason: str) -> None:
        self.encoding = encoding
        self.reason = reason
        super().__init__(f"{encoding or 'unknown'} body does not decompress: {reason}")


def compress(body: bytes, codec: str) -> tuple[bytes, str]:
    """(`body` compressed with `codec`, `codec`); (`body`, "") when that is not smaller.

    ValueError for a codec not in CODECS.
    """
    if codec == "zstd":
        packed = _zstd_compressor.compress(body)
    elif codec == "zlib":
        packed = zlib.compress(body, ZLIB_LEVEL)
    else:
        raise ValueError(f"unknown compression codec {codec!r}: allowed {', '.join(CODECS)}")
    if len(packed) >= len(body):
        return body, ""
    return packed, codec


def decompress(body: bytes, encoding: str, max_bytes: int = MAX_INFLATED_BYTES) -> bytes:
    """The original bytes of a body stored with `encoding` ("" = stored as sent).

    CorruptBody when the body does not decompress, would inflate past `max_bytes`, or
    `encoding` names no codec this broker knows.
    """
    if not encoding:
        return body
    if encoding == "zstd":
        return _zstd_decompress(body, max_bytes)
    if encoding == "zlib":
        return _zlib_decompress(body, max_bytes)
    raise CorruptBody(encoding, "unknown encoding")


def _zstd_decompress(body: bytes, max_bytes: int) -> bytes:
    try:
        size = zstandard.frame_content_size(body)
    except zstandard.ZstdError as exc:
        raise CorruptBody("zstd", str(exc)) from None
    if size < 0:
        # -1: not recorded. compress() always records it; without it decompress() would
        # have to allocate a whole bound up front.
        raise CorruptBody("zstd", "frame header gives no content size")
    if size > max_bytes:
        raise CorruptBody("zstd", f"frame claims {size} bytes, over {max_bytes}")
    try:
        return _zstd_decompressor.decompress(body)
    except (zstandard.ZstdError, MemoryError) as exc:
        raise CorruptBody("zstd", str(exc) or type(exc).__name__) from None


def _zlib_decompress(body: bytes, max_bytes: int) -> bytes:
    inflater = zlib.decompressobj()
    try:
        data = inflater.decompress(body, max_bytes)
    except zlib.error as exc:
        raise CorruptBody("zlib", str(exc)) from None
    if inflater.unconsumed_tail:
        raise CorruptBody("zlib", f"inflates to more than {max_bytes} bytes")
    if not inflater.eof:
        raise CorruptBody("zlib", "truncated stream")
    if inflater.unused_data:
        raise CorruptBody("zlib", f"{len(inflater.unused_data)} bytes after the stream")
    return data
