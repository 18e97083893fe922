"""bench.profile: py-spy's collapsed stacks sorted by step and by function (the sampling
itself needs py-spy and is run by hand: docs/benchmarks.md)."""

from __future__ import annotations

from bench.profile import OTHER, read_raw, render, step_of

RAW = """\
<module> (<string>:1);run_gateway (mpbroker/workers/gateway.py:900);FrameParser.feed (mpbroker/stomp/_parser.py:80);FrameParser._parse_head (mpbroker/stomp/_parser.py:120) 30
<module> (<string>:1);Gateway._read_frames (mpbroker/workers/gateway.py:560);GatewaySession._send (mpbroker/session/_session.py:430);encode (mpbroker/records.py:300) 10
<module> (<string>:1);Gateway._read_frames (mpbroker/workers/gateway.py:560) 5
<module> (<string>:1);run (trio/_core/_run.py:2000);get_events (trio/_core/_io_epoll.py:220) 4
<module> (<string>:1);something (/usr/lib/python3.11/json/decoder.py:10) 1

"""


def test_a_sample_is_the_step_of_its_innermost_frame_of_a_known_kind() -> None:
    profile = read_raw("gateway 0", RAW.splitlines())
    assert profile.samples == 50
    assert profile.steps == {
        "parse frames": 30,
        "ring records (msgpack)": 10,
        "gateway shell": 5,
        "sockets and event loop (trio)": 4,
        OTHER: 1,
    }
    assert profile.functions.most_common(1) == [
        ("FrameParser._parse_head (mpbroker/stomp/_parser.py)", 30)
    ]
    assert step_of("park (mpbroker/shm/_park.py:40)") == "waiting for work (parked)"
    assert step_of("<module> (<string>:1)") is None


def test_the_table_gives_each_step_as_a_share_of_its_process() -> None:
    lines = render([read_raw("gateway 0", RAW.splitlines())], top=2)
    assert lines[0].split() == ["step", "gateway", "0"]
    assert lines[2].split() == ["parse", "frames", "60.0%"]
    assert lines[-2:] == [
        "   60.0%  FrameParser._parse_head (mpbroker/stomp/_parser.py)",
        "   20.0%  encode (mpbroker/records.py)",
    ]
