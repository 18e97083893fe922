"""The notify protocol: what is sent, where to, and what the environment may hold."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from mpbroker.systemd import Notifier, NotifyError, encode, notify_address, watchdog_interval_s


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    """A fake service manager: a datagram socket at a path."""
    path = str(tmp_path / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    yield path, sock
    sock.close()


def test_fields_are_key_value_lines_and_a_value_is_one_line() -> None:
    assert encode({"READY": 1, "STATUS": "ok"}) == b"READY=1\nSTATUS=ok"
    # A newline in a status would end the field and start a bogus one.
    assert encode({"STATUS": "a\nWATCHDOG=1\r"}) == b"STATUS=a WATCHDOG=1 "


def test_a_path_or_an_abstract_name_is_an_address_and_nothing_else_is() -> None:
    assert notify_address("/run/systemd/notify") == "/run/systemd/notify"
    assert notify_address("@/org/systemd/notify") == "\0/org/systemd/notify"
    for bad in ("relative/path", "@", "vsock:2:1234"):
        with pytest.raises(NotifyError, match=r"\$NOTIFY_SOCKET = "):
            notify_address(bad)


def test_the_watchdog_is_fed_at_half_its_interval_and_only_for_its_process() -> None:
    assert watchdog_interval_s({}, 10) is None
    assert watchdog_interval_s({"WATCHDOG_USEC": "30000000"}, 10) == 15.0
    assert watchdog_interval_s({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "10"}, 10) == 15.0
    # Another process's watchdog is not ours to feed.
    assert watchdog_interval_s({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "11"}, 10) is None
    for bad in ("soon", "0", "-5"):
        with pytest.raises(NotifyError, match=r"\$WATCHDOG_USEC"):
            watchdog_interval_s({"WATCHDOG_USEC": bad}, 10)


def test_the_environment_is_read_once_and_not_handed_down(
    listener: tuple[str, socket.socket],
) -> None:
    path, _sock = listener
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}
    notifier = Notifier.from_environment(env)
    assert notifier is not None
    try:
        assert notifier.address == path and notifier.watchdog_s == 1.0
    finally:
        notifier.close()
    # The fork server and the workers must not notify: they do not inherit the variables.
    assert env == {}
    assert Notifier.from_environment({}) is None
    bad = {"NOTIFY_SOCKET": "vsock:2:5", "WATCHDOG_USEC": "1"}
    with pytest.raises(NotifyError):
        Notifier.from_environment(bad)
    assert bad == {}


def test_each_message_is_one_datagram(listener: tuple[str, socket.socket]) -> None:
    path, sock = listener
    notifier = Notifier(path, 1.0)
    try:
        assert notifier.ready("serving")
        assert sock.recv(4096) == b"READY=1\nSTATUS=serving"
        assert notifier.reloading("reloading")
        fields = dict(line.split("=", 1) for line in sock.recv(4096).decode().splitlines())
        assert fields["RELOADING"] == "1" and fields["STATUS"] == "reloading"
        assert int(fields["MONOTONIC_USEC"]) > 0
        assert notifier.watchdog()
        assert sock.recv(4096) == b"WATCHDOG=1"
        assert notifier.stopping("stopping: SIGTERM")
        assert sock.recv(4096) == b"STOPPING=1\nSTATUS=stopping: SIGTERM"
    finally:
        notifier.close()


def test_an_abstract_socket_name_is_reached() -> None:
    name = f"@mpbroker-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name[1:])
    sock.settimeout(5)
    try:
        notifier = Notifier.from_environment({"NOTIFY_SOCKET": name})
        assert notifier is not None
        try:
            assert notifier.status("hello")
            assert sock.recv(4096) == b"STATUS=hello"
        finally:
            notifier.close()
    finally:
        sock.close()


def test_a_manager_that_is_gone_is_logged_once_and_never_stops_the_broker(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    notifier = Notifier(str(tmp_path / "nobody-listens"))
    try:
        with caplog.at_level(logging.WARNING, logger="mpbroker.systemd"):
            assert not notifier.watchdog()
            assert not notifier.status("still here")
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1
        assert "cannot notify the service manager at" in lines[0]
        assert "No such file or directory" in lines[0]
    finally:
        notifier.close()
