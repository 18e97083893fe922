"""SendTemplate: the stamped frames are exactly what encode_frame would write."""

from __future__ import annotations

import pytest

from mpbroker.loadgen.wire import BODY_HEADER_BYTES, SendTemplate, body_prefix, make_body
from mpbroker.stomp import CLIENT_COMMANDS, Frame, FrameParser, encode_frame

TOKEN = b"12345678"


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("destination", ["/queue/bench", "/topic/100%"])
def test_batches_equal_frames_encoded_one_by_one(persistent: bool, destination: str) -> None:
    template = SendTemplate(destination, persistent=persistent, token=TOKEN, producer=7, size=64)
    headers = {"destination": destination}
    if persistent:
        headers["persistent"] = "true"
    expected = b"".join(
        encode_frame(Frame("SEND", headers, make_body(TOKEN, 7, seq, 64)))
        for seq in range(995, 1005)
    )
    assert template.frames(995, 1005) == expected
    assert template.frame_bytes * 10 == len(expected)


def test_frame_with_receipt_parses_back() -> None:
    template = SendTemplate("/queue/q", persistent=False, token=TOKEN, producer=0, size=30)
    (frame,) = FrameParser(commands=CLIENT_COMMANDS).feed(template.frame_with_receipt(42, "r42"))
    assert frame.headers["receipt"] == "r42"
    assert frame.body == make_body(TOKEN, 0, 42, 30)
    assert frame.body.startswith(body_prefix(TOKEN) + b"00000:0000000042:")


def test_body_size_limits() -> None:
    assert len(make_body(TOKEN, 1, 2, BODY_HEADER_BYTES)) == BODY_HEADER_BYTES
    with pytest.raises(ValueError, match="minimum"):
        make_body(TOKEN, 1, 2, BODY_HEADER_BYTES - 1)
    with pytest.raises(ValueError, match="8 bytes"):
        body_prefix(b"short")
