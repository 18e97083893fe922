"""Body compression: round trips per codec, "does not pay" keeps the original, and every way a
stored body can be damaged is a CorruptBody, never wrong bytes or a crash."""

from __future__ import annotations

import json
import random
import struct
import zlib

import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

import mpbroker.compression as compression
from mpbroker.compression import CODECS, CorruptBody, compress, decompress
from mpbroker.config import CompressionSettings

JSONISH = json.dumps([{"order": i, "status": "shipped", "city": "lisbon"} for i in range(200)])
TEXT = JSONISH.encode()


def test_the_config_offers_exactly_the_codecs_there_are() -> None:
    [field] = [f for f in CompressionSettings.__dataclass_fields__.values() if f.name == "codec"]
    assert set(field.metadata["choices"]) == set(CODECS)
    assert CompressionSettings().codec == "zstd"


@pytest.mark.parametrize("codec", CODECS)
def test_compressible_body_round_trips_smaller(codec: str) -> None:
    packed, encoding = compress(TEXT, codec)
    assert encoding == codec
    assert len(packed) < len(TEXT) / 4
    assert decompress(packed, encoding) == TEXT


@pytest.mark.parametrize("codec", CODECS)
def test_a_body_compression_does_not_shrink_is_kept_as_sent(codec: str) -> None:
    noise = random.Random(1).randbytes(4096)
    assert compress(noise, codec) == (noise, "")
    assert compress(b"ab", codec) == (b"ab", "")


@given(body=st.binary(max_size=3000), codec=st.sampled_from(CODECS))
def test_whatever_compress_returns_decompresses_to_the_original(body: bytes, codec: str) -> None:
    packed, encoding = compress(body, codec)
    assert encoding in ("", codec)
    assert len(packed) <= len(body)
    assert decompress(packed, encoding) == body


def test_an_empty_encoding_is_the_body_as_sent() -> None:
    assert decompress(b"\x28\xb5\x2f\xfd garbage", "") == b"\x28\xb5\x2f\xfd garbage"


def test_an_unknown_codec_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown compression codec 'gzip'"):
        compress(TEXT, "gzip")
    with pytest.raises(CorruptBody, match="unknown encoding"):
        decompress(TEXT, "brotli")


def _flip(data: bytes, at: int) -> bytes:
    damaged = bytearray(data)
    damaged[at] ^= 0x55
    return bytes(damaged)


@pytest.mark.parametrize("codec", CODECS)
def test_a_damaged_body_is_a_corrupt_body(codec: str) -> None:
    packed, _ = compress(TEXT, codec)
    for damaged in (
        _flip(packed, len(packed) // 2),  # caught by zstd's frame checksum / zlib's Adler-32
        _flip(packed, len(packed) - 1),
        packed[: len(packed) // 2],
        packed[:3],
        b"",
        b"not compressed at all",
    ):
        with pytest.raises(CorruptBody) as info:
            decompress(damaged, codec)
        assert info.value.encoding == codec
        assert str(info.value).startswith(f"{codec} body does not decompress: ")


def test_bytes_after_a_zlib_stream_are_refused() -> None:
    # (zstd stops at the end of its frame, whose checksum already vouched for the content.)
    packed, _ = compress(TEXT, "zlib")
    with pytest.raises(CorruptBody, match="8 bytes after the stream"):
        decompress(packed + b"trailing", "zlib")


@pytest.mark.parametrize("codec", CODECS)
def test_a_body_inflating_past_the_bound_is_refused(codec: str) -> None:
    packed, _ = compress(b"x" * 100_000, codec)
    assert decompress(packed, codec, max_bytes=100_000) == b"x" * 100_000
    with pytest.raises(CorruptBody, match="99999"):
        decompress(packed, codec, max_bytes=99_999)


def test_a_forged_zstd_content_size_allocates_nothing() -> None:
    packed, _ = compress(TEXT, "zstd")
    # Frame header descriptor 0xE0: single segment, 8-byte content size, which claims 1 TB.
    header_size = zstandard.frame_header_size(packed)
    forged = packed[:4] + b"\xe0" + struct.pack("<Q", 10**12) + packed[header_size:]
    assert zstandard.frame_content_size(forged) == 10**12
    with pytest.raises(CorruptBody, match=f"claims {10**12} bytes"):
        decompress(forged, "zstd")
    assert compression.MAX_INFLATED_BYTES < 10**12


def test_a_zstd_frame_without_its_content_size_is_refused() -> None:
    # The broker always records it; one without could only make decompress() guess a size.
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(TEXT)
    with pytest.raises(CorruptBody, match="no content size"):
        decompress(frame, "zstd")


def test_zlib_is_plain_zlib_level_6() -> None:
    packed, _ = compress(TEXT, "zlib")
    assert packed == zlib.compress(TEXT, 6)
    assert zlib.decompress(packed) == TEXT
