"""The systemd units in ops/: `systemd-analyze verify` accepts each one without a warning,
and the settings the broker relies on are there (parsed, so these run without systemd)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

OPS = Path(__file__).resolve().parents[2] / "ops"
SERVICES = sorted(OPS.glob("*.service"))
TIMERS = sorted(OPS.glob("*.timer"))
UNITS = SERVICES + TIMERS
BROKERS = [OPS / "mpbroker.service", OPS / "mpbroker@.service"]
# Where the units expect the install; the tests put the test venv there instead.
PREFIX = "/opt/mpbroker"
HARDENING = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectControlGroups": "yes",
    "RestrictSUIDSGID": "yes",
    "LockPersonality": "yes",
    "RestrictRealtime": "yes",
    "SystemCallArchitectures": "native",
    "User": "mpbroker",
    "Group": "mpbroker",
    "UMask": "0077",
}

Unit = dict[str, dict[str, list[str]]]


def parse_unit(path: Path) -> Unit:
    """A unit file as section -> key -> every value it is given, in order (systemd allows a
    key more than once, which configparser does not). No line continuations: ours have none."""
    sections: Unit = {}
    current: dict[str, list[str]] | None = None
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        assert not line.endswith("\\"), f"{path.name}:{number}: a continued line"
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{path.name}:{number}: a setting before any section"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}:{number}: not KEY=VALUE: {line!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def setting(unit: Unit, section: str, key: str) -> str:
    """The value a key ends up with (the last one given)."""
    values = unit.get(section, {}).get(key)
    assert values, f"[{section}] has no {key}="
    return values[-1]


def test_ops_has_the_units() -> None:
    names = {path.name for path in UNITS}
    assert names == {
        "mpbroker.service",
        "mpbroker@.service",
        "mpbroker-export.service",
        "mpbroker-export.timer",
    }


@pytest.mark.parametrize("path", BROKERS, ids=lambda p: p.name)
def test_broker_units(path: Path) -> None:
    unit = parse_unit(path)
    assert setting(unit, "Unit", "After") == "network-online.target"
    assert setting(unit, "Unit", "Wants") == "network-online.target"
    assert setting(unit, "Install", "WantedBy") == "multi-user.target"
    assert setting(unit, "Service", "Type") == "notify"
    assert setting(unit, "Service", "KillMode") == "mixed"
    assert setting(unit, "Service", "WatchdogSec") == "2min"
    assert setting(unit, "Service", "ExecReload") == "/bin/kill -HUP $MAINPID"
    assert setting(unit, "Service", "Restart") == "on-failure"
    assert setting(unit, "Service", "StateDirectoryMode") == "0700"
    assert setting(unit, "Service", "LimitNOFILE") == "65536"
    assert setting(unit, "Service", "SyslogIdentifier") == "mpbroker"
    assert set(setting(unit, "Service", "RestrictAddressFamilies").split()) == {
        "AF_UNIX",
        "AF_INET",
        "AF_INET6",
    }
    for key, value in HARDENING.items():
        assert setting(unit, "Service", key) == value, key
    # The rings live in /dev/shm: nothing may take it away from the broker.
    assert "PrivateIPC" not in unit["Service"]
    assert not any("/dev/shm" in v for v in unit["Service"].get("InaccessiblePaths", []))
    # Two shutdown groups of broker.shutdown_timeout_ms (10 s) each must fit in the stop.
    assert int(setting(unit, "Service", "TimeoutStopSec").removesuffix("s")) >= 2 * 10


def test_the_broker_service() -> None:
    unit = parse_unit(OPS / "mpbroker.service")
    assert setting(unit, "Service", "ExecStart") == (
        f"{PREFIX}/bin/mpbroker serve --config /etc/mpbroker/mpbroker.toml --data-dir %S/mpbroker"
    )
    assert setting(unit, "Service", "StateDirectory") == "mpbroker"


def test_the_instance_template() -> None:
    unit = parse_unit(OPS / "mpbroker@.service")
    assert setting(unit, "Service", "ExecStart") == (
        f"{PREFIX}/bin/mpbroker serve --config /etc/mpbroker/%i.toml --data-dir %S/mpbroker-%i"
    )
    assert setting(unit, "Service", "StateDirectory") == "mpbroker-%i"


def test_the_export_service() -> None:
    unit = parse_unit(OPS / "mpbroker-export.service")
    assert setting(unit, "Service", "Type") == "oneshot"
    assert setting(unit, "Service", "ExecStart") == (
        f"{PREFIX}/bin/mpbroker export --data-dir %S/mpbroker --out %S/mpbroker-export"
    )
    # The data dir too: SQLite readers of a WAL database may have to write its -shm file.
    assert setting(unit, "Service", "StateDirectory").split() == ["mpbroker", "mpbroker-export"]
    assert setting(unit, "Service", "Nice") == "10"
    assert setting(unit, "Service", "IOSchedulingClass") == "idle"
    for key, value in HARDENING.items():
        assert setting(unit, "Service", key) == value, key


def test_the_export_timer() -> None:
    unit = parse_unit(OPS / "mpbroker-export.timer")
    assert setting(unit, "Timer", "Unit") == "mpbroker-export.service"
    assert setting(unit, "Timer", "OnCalendar") == "hourly"
    assert setting(unit, "Timer", "Persistent") == "true"
    assert setting(unit, "Timer", "RandomizedDelaySec") == "5min"
    assert setting(unit, "Install", "WantedBy") == "timers.target"


def systemd_analyze() -> str:
    """The systemd-analyze command; a skip without it, except in CI, which must have it."""
    found = shutil.which("systemd-analyze")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("systemd-analyze is missing in CI: install the systemd package")
        pytest.skip("systemd-analyze is not installed (the systemd package)")
    return found


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_systemd_analyze_verify(path: Path, tmp_path: Path) -> None:
    """verify refuses a unit whose program does not exist, so the copies name the test venv
    (sys.prefix, which has bin/mpbroker); a timer is verified with its service beside it."""
    analyze = systemd_analyze()
    assert Path(sys.prefix, "bin", "mpbroker").exists()
    names = [path.name]
    if path.suffix == ".timer":
        names.append(path.with_suffix(".service").name)
    for name in names:
        text = (OPS / name).read_text(encoding="utf-8").replace(PREFIX, sys.prefix)
        (tmp_path / name).write_text(text, encoding="utf-8")
    result = subprocess.run(
        [analyze, "verify", str(tmp_path / path.name)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # verify warns (and still exits 0) about an unknown key or a bad value: any line naming
    # one of our units fails (a template's as its instance, mpbroker@test_instance.service,
    # too). Lines about the host's own units are not ours to judge.
    marks = [name.partition("@")[0] + "@" if "@" in name else name for name in names]
    ours = [line for line in result.stderr.splitlines() if any(m in line for m in marks)]
    assert result.returncode == 0 and not ours, result.stderr
