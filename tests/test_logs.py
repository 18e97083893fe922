"""The log's defences: repeats of a kind, from any number of addresses, collapse into one
line per window, and client text is cut and escaped before a line quotes it."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

from mpbroker import logs
from mpbroker.logs import Collapsed, Collapser, client_text, peer_address


def test_the_first_event_is_logged_and_the_repeats_are_summed_up_when_the_window_ends() -> None:
    c = Collapser(window_s=10)
    assert c.admit("refused a frame", "127.0.0.1", 0.0)
    assert not any(c.admit("refused a frame", "127.0.0.1", 0.001 * n) for n in range(1, 5212))
    assert c.take(9.9) == []
    [summary] = c.take(10.0)
    assert summary == Collapsed("refused a frame", 5211, 10.0, 1, False, "127.0.0.1", 5211)
    assert summary.text() == (
        "refused a frame: … and 5,211 more like it from 127.0.0.1 in the last 10 s"
    )
    assert c.take(10.5) == []  # handed out once


def test_a_flood_that_goes_on_costs_one_line_per_window() -> None:
    c = Collapser(window_s=10)
    logged = [c.admit("protocol error", "10.0.0.1", t / 10) for t in range(300)]  # 30 s
    assert logged.count(True) == 1
    assert [s.count for s in c.take(30.0)] == [99, 100, 100]
    # Quiet for a whole window: it closes, and the next one is logged in full again.
    assert c.take(40.0) == [] and len(c) == 0
    assert c.admit("protocol error", "10.0.0.1", 41.0)


def test_a_kind_collapses_over_every_address_with_a_count_of_each() -> None:
    c = Collapser(window_s=10)
    assert c.admit("refused a frame", "10.0.0.1", 0)
    assert c.admit("protocol error", "10.0.0.1", 0)  # kinds are collapsed apart
    # 3,000 addresses, one of which sends more than the others (it sent 6, and 5 of them
    # after the count of the first was lost to the cap: "at least").
    addresses = [f"10.0.{n // 250}.{n % 250}" for n in range(3000)]
    assert not any(c.admit("refused a frame", address, 1) for address in addresses)
    assert not any(c.admit("refused a frame", "10.0.0.7", 2) for _ in range(5))
    assert not c.admit("protocol error", "10.0.0.2", 3)
    refused, errors = c.take(10)
    assert refused == Collapsed("refused a frame", 3005, 10, 1000, True, "10.0.0.7", 5)
    assert refused.text() == (
        "refused a frame: … and 3,005 more like it from more than 1,000 addresses "
        "(most from 10.0.0.7: at least 5) in the last 10 s"
    )
    assert errors.text() == "protocol error: … and 1 more like it from 10.0.0.2 in the last 10 s"
    assert len(c) == 2  # one window per kind, whatever the addresses


def test_a_few_addresses_are_counted_exactly() -> None:
    c = Collapser(window_s=10)
    assert c.admit("access denied", "10.0.0.9", 0)  # the logged one is not counted
    for address, times in (("10.0.0.1", 2), ("10.0.0.2", 7), ("10.0.0.3", 1)):
        for _ in range(times):
            assert not c.admit("access denied", address, 1)
    [summary] = c.take_all(2)
    assert (summary.addresses, summary.more_addresses, summary.busiest) == (3, False, "10.0.0.2")
    assert summary.text() == (
        "access denied: … and 10 more like it from 3 addresses (most from 10.0.0.2: 7) "
        "in the last 2.0 s"
    )


def test_past_the_cap_the_address_that_sends_most_is_still_named() -> None:
    c = Collapser(window_s=10, max_addresses=3)
    assert c.admit("protocol error", "10.0.0.1", 0)
    # One address sends every other event among a stream of new ones: it stays followed
    # (it sends more than a quarter), and its count is at most a quarter short.
    for n in range(400):
        c.admit("protocol error", f"10.0.1.{n}", 1)
        c.admit("protocol error", "10.0.0.66", 1)
    [summary] = c.take(10)
    assert (summary.count, summary.addresses, summary.more_addresses) == (800, 3, True)
    assert summary.busiest == "10.0.0.66" and 800 // 4 <= summary.busiest_count <= 400
    # Memory stays bounded: at most `max_addresses` followed.
    c.admit("protocol error", "10.0.0.1", 11)
    for n in range(1000):
        c.admit("protocol error", f"10.0.2.{n}", 12)
    [window] = c._windows.values()
    assert len(window.by_address) <= 3


def test_events_without_an_address_are_summed_up_without_one() -> None:
    c = Collapser(window_s=10)
    kind = "store error while recording acknowledgements"
    assert c.admit(kind, "", 0)
    assert not c.admit(kind, "", 1) and not c.admit(kind, "", 2)
    [summary] = c.take(10)
    assert summary.text() == f"{kind}: … and 2 more like it in the last 10 s"


def test_a_window_without_repeats_ends_silently() -> None:
    c = Collapser(window_s=10)
    assert c.admit("refused connection", "10.0.0.1", 0)
    assert c.take(11) == []
    assert c.admit("refused connection", "10.0.0.2", 11)


def test_stopping_sums_up_the_open_windows_too() -> None:
    c = Collapser(window_s=10)
    c.admit("refused a frame", "10.0.0.1", 0)
    c.admit("refused a frame", "10.0.0.1", 0.1)
    c.admit("protocol error", "10.0.0.2", 0.2)
    [summary] = c.take_all(0.45)
    assert summary.text() == (
        "refused a frame: … and 1 more like it from 10.0.0.1 in the last 0.5 s"
    )
    assert len(c) == 0


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("/queue/orders", "/queue/orders"),
        ("two\nlines", "two\\nlines"),
        ("a\r\n2026-11-25 00:00:00 INFO forged", "a\\r\\n2026-11-25 00:00:00 INFO forged"),
        ("bell\x07 esc\x1b[31m del\x7f", "bell\\x07 esc\\x1b[31m del\\x7f"),
        ("back\\slash 'a\\nb'", "back\\slash 'a\\nb'"),  # left as it is
        ("line\u2028sep nbsp\u00a0", "line\\u2028sep nbsp\\xa0"),
        ("crème brûlée ☕", "crème brûlée ☕"),
        ("\U000e0041", "\\U000e0041"),
    ],
)
def test_client_text_escapes_what_could_break_or_forge_a_line(text: str, shown: str) -> None:
    assert client_text(text) == shown


def test_client_text_is_cut_and_says_how_much() -> None:
    assert client_text("x" * 1200) == "x" * 200 + "… (1,000 more characters)"
    assert client_text("\n" * 5, limit=2) == "\\n\\n… (3 more characters)"
    assert client_text("x" * 200) == "x" * 200


@pytest.mark.parametrize(
    ("peer", "address"),
    [("127.0.0.1:5000", "127.0.0.1"), ("::1:61613", "::1"), ("?", "?"), ("host", "host")],
)
def test_the_address_of_a_peer(peer: str, address: str) -> None:
    assert peer_address(peer) == address


def test_the_shell_logs_the_first_line_then_the_summary(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logs, "_collapser", Collapser(window_s=10))
    clock = iter([0.0, 1.0, 2.0, 12.0])
    monkeypatch.setattr(logs.time, "monotonic", lambda: next(clock))
    log = logging.getLogger("mpbroker.test")
    with caplog.at_level(logging.INFO):
        for n in range(3):
            peer = f"127.0.0.{1 + n % 2}:{5000 + n}"
            logs.log_collapsed(
                log,
                logging.WARNING,
                "refused a frame",
                peer,
                "refused a frame from %s: %s",
                peer,
                client_text(f"bad\n{n}"),
            )
        logs.flush_collapsed()
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "refused a frame from 127.0.0.1:5000: bad\\n0"),
        (
            "WARNING",
            "refused a frame: … and 2 more like it from 2 addresses (most from 127.0.0.2: 1) "
            "in the last 12 s",
        ),
    ]


def test_every_message_stays_on_its_line_but_a_traceback_keeps_its_lines() -> None:
    formatter = logs.LineFormatter("%(levelname)s %(message)s")
    record = logging.LogRecord(
        "mpbroker.p2p", logging.INFO, __file__, 1, "flow: producers to %s stopped", ("/q\nx",), None
    )
    assert formatter.format(record) == "INFO flow: producers to /q\\nx stopped"
    try:
        raise ValueError("boom")
    except ValueError:
        failed = logging.LogRecord(
            "mpbroker", logging.ERROR, __file__, 1, "a\x1bb", (), sys.exc_info()
        )
    lines = formatter.format(failed).splitlines()
    assert lines[0] == "ERROR a\\x1bb"
    assert lines[1] == "Traceback (most recent call last):" and lines[-1] == "ValueError: boom"


# -- journald ----------------------------------------------------------------------------


def test_journal_lines_carry_their_priority_and_no_time() -> None:
    formatter = logs.JournalFormatter("supervisor[%(process)d] %(levelname)s %(message)s")
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "stopped\nforged", (), None)
    record.process = 42
    assert formatter.format(record) == "<4>supervisor[42] WARNING stopped\\nforged"
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "crashed", (), sys.exc_info())
    record.process = 42
    text = formatter.format(record)
    # One entry: the traceback folded into the event's line, at its priority.
    assert "\n" not in text
    assert text.startswith("<3>supervisor[42] ERROR crashed\\nTraceback (most recent call last):")
    assert text.endswith("\\nValueError: boom")


@pytest.mark.parametrize(
    ("level", "priority"),
    [
        (logging.DEBUG, 7),
        (logging.INFO, 6),
        (logging.WARNING, 4),
        (logging.ERROR, 3),
        (logging.CRITICAL, 2),
    ],
)
def test_levels_map_to_syslog_priorities(level: int, priority: int) -> None:
    assert logs.journal_priority(level) == priority


def test_auto_is_journal_only_when_stderr_is_the_stream_journald_named(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    other = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        st = os.fstat(write_end)
        stream = f"{st.st_dev}:{st.st_ino}"
        assert logs.log_format("auto", stream, write_end) == "journal"
        # stderr redirected elsewhere (2>file) no longer matches: text.
        assert logs.log_format("auto", stream, other) == "text"
        assert logs.log_format("auto", "1:2", write_end) == "text"
        assert logs.log_format("auto", None, write_end) == "text"
        assert logs.log_format("text", stream, write_end) == "text"
        assert logs.log_format("journal", None, write_end) == "journal"
    finally:
        for fd in (read_end, write_end, other):
            os.close(fd)
