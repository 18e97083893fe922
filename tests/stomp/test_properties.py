"""Hypothesis properties: whatever encode_frame writes, FrameParser reads back, however it is
chunked; and no input makes the parser fail with anything but a ProtocolError."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mpbroker.stomp import (
    CLIENT_COMMANDS,
    SERVER_COMMANDS,
    Frame,
    FrameLimits,
    FrameParser,
    ProtocolError,
    encode_frame,
)

ALL_COMMANDS = CLIENT_COMMANDS | SERVER_COMMANDS
ESCAPED_COMMANDS = sorted(ALL_COMMANDS - {"CONNECT", "STOMP", "CONNECTED"})


def header_texts(version: str, *, name: bool, escaped: bool) -> st.SearchStrategy[str]:
    """Header names or values that ``version`` can carry in a frame (escaped or not)."""
    if not escaped or version == "1.0":
        # Nothing is escaped: CR and LF would end the line, a colon would end the name.
        excluded = "\r\n:" if name else "\r\n"
    elif version == "1.1":
        excluded = "\r"  # 1.1 has no escape for CR
    else:
        excluded = ""
    alphabet = st.characters(codec="utf-8", exclude_characters=excluded)
    # Mix in the characters that matter, so they are not left to chance.
    specials = st.sampled_from([c for c in "\\:\r\n\0 " if c not in excluded])
    return st.text(alphabet | specials, min_size=1 if name else 0, max_size=12)


@st.composite
def frames(draw: st.DrawFn, version: str) -> Frame:
    command = draw(st.sampled_from(sorted(ALL_COMMANDS)))
    escaped = command in ESCAPED_COMMANDS
    headers = draw(
        st.dictionaries(
            header_texts(version, name=True, escaped=escaped).filter(
                lambda n: n != "content-length"
            ),
            header_texts(version, name=False, escaped=escaped),
            max_size=6,
        )
    )
    body = draw(st.binary(max_size=64) | st.sampled_from([b"", b"\0", b"\n\n\0\n"]))
    return Frame(command, headers, body)


def expected_after_round_trip(frame: Frame) -> Frame:
    headers = dict(frame.headers)
    if frame.body:
        headers["content-length"] = str(len(frame.body))
    return Frame(frame.command, headers, frame.body)


VERSIONS = st.sampled_from(["1.0", "1.1", "1.2"])


@settings(max_examples=150)
@given(st.data(), VERSIONS)
def test_parse_inverts_encode(data: st.DataObject, version: str) -> None:
    frame = data.draw(frames(version))
    parser = FrameParser(commands=ALL_COMMANDS, version=version)
    assert parser.feed(encode_frame(frame, version)) == [expected_after_round_trip(frame)]
    assert parser.buffered_bytes == 0


@settings(max_examples=100)
@given(st.data(), VERSIONS)
def test_a_stream_reads_the_same_however_it_is_chunked(data: st.DataObject, version: str) -> None:
    sent = data.draw(st.lists(frames(version), max_size=5))
    heartbeats = data.draw(
        st.lists(
            st.sampled_from([b"", b"\n", b"\r\n", b"\n\n"]),
            min_size=len(sent) + 1,
            max_size=len(sent) + 1,
        )
    )
    stream = heartbeats[0] + b"".join(
        encode_frame(frame, version) + beat
        for frame, beat in zip(sent, heartbeats[1:], strict=True)
    )
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    parser = FrameParser(commands=ALL_COMMANDS, version=version)
    received: list[Frame] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        received += parser.feed(stream[start:end])
    assert received == [expected_after_round_trip(frame) for frame in sent]
    assert parser.buffered_bytes == 0


SMALL = FrameLimits(max_frame_bytes=64, max_headers=4, max_header_bytes=16, max_command_bytes=12)


@settings(max_examples=300)
@given(
    st.lists(
        st.binary(max_size=20)
        | st.sampled_from(
            [b"SEND\n", b"CONNECT\n", b"\n", b"\r\n", b"\0", b"k:v\n", b"\\", b"content-length:3\n"]
        ),
        max_size=12,
    ),
    VERSIONS,
    st.booleans(),
)
def test_garbage_only_ever_raises_protocol_error(
    chunks: list[bytes], version: str, small: bool
) -> None:
    parser = FrameParser(SMALL if small else FrameLimits(), version=version)
    fed = 0
    for chunk in chunks:
        fed += len(chunk)
        try:
            for frame in parser.feed(chunk):
                assert frame.command in CLIENT_COMMANDS
        except ProtocolError:
            break
    # What it holds for an unfinished frame is some of what it was given, never more.
    assert 0 <= parser.buffered_bytes <= fed
