"""ops/run.sh and ops/test.sh (through ops/_venv.sh) in a copy of them in a temporary
checkout, with a stand-in Python that makes the venv and answers for pip in an instant: what
they install and when, what they say while pip works, and what they show when it fails."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

OPS = Path(__file__).resolve().parents[2] / "ops"
PYPROJECT = OPS.parent / "pyproject.toml"
TIMEOUT_S = 60

# python3 and, copied into the venv, the venv's python. It logs each `pip` call to $PIP_CALLS
# and prints what setuptools prints on an editable install; $PIP_FAILS makes pip fail.
FAKE_PYTHON = """\
#!{bash}
case "$1 ${{2:-}}" in
"-c "*) exit 0 ;;
"-m venv")
    mkdir -p "$3/bin"
    cp "$0" "$3/bin/python"
    for tool in mpbroker ruff mypy pytest; do
        printf '#!/bin/sh\\necho "%s $*"\\n' "$tool" >"$3/bin/$tool"
        chmod +x "$3/bin/$tool"
    done
    exit 0
    ;;
"-m pip")
    shift 2
    echo "$*" >>"$PIP_CALLS"
    echo "Obtaining file:///checkout"
    echo "********************************************************************************" >&2
    echo "!!" >&2
    echo "SetuptoolsDeprecationWarning: License classifiers are deprecated." >&2
    if [[ -n "${{PIP_FAILS:-}}" ]]; then
        echo "ERROR: No matching distribution found for trio>=0.25" >&2
        exit 1
    fi
    exit 0
    ;;
esac
echo "fake python: unexpected $*" >&2
exit 99
"""
SETUPTOOLS_NOISE = ("*****", "!!", "SetuptoolsDeprecationWarning")


class Checkout:
    """A checkout with ops/{_venv,run,test}.sh and pyproject.toml, and no venv yet."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path / "checkout"
        (self.root / "ops").mkdir(parents=True)
        for script in ("_venv.sh", "run.sh", "test.sh"):
            shutil.copy(OPS / script, self.root / "ops" / script)
        shutil.copy(PYPROJECT, self.root / "pyproject.toml")
        self.venv = self.root / ".venv"
        self.python = tmp_path / "python3"
        bash = shutil.which("bash")
        assert bash is not None
        self.python.write_text(FAKE_PYTHON.format(bash=bash), encoding="utf-8")
        self.python.chmod(0o755)
        self.calls = tmp_path / "pip-calls"

    def run(self, script: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        """Run ops/`script`; the pip calls it made are in `pip_calls()`."""
        self.calls.write_text("", encoding="utf-8")
        environ = {
            key: value
            for key, value in os.environ.items()
            if key not in ("MPBROKER_EXTRAS", "PIP_FAILS", "VIRTUAL_ENV")
        }
        return subprocess.run(
            ["bash", str(self.root / "ops" / script), *args],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env={**environ, "PYTHON": str(self.python), "PIP_CALLS": str(self.calls), **env},
            cwd=self.root,
        )

    def pip_calls(self) -> list[str]:
        """What the last run installed editable: the checkout, with extras if any."""
        calls = self.calls.read_text(encoding="utf-8").splitlines()
        return [call.split(" -e ")[1] for call in calls if " -e " in call]

    def installs(self, extras: str = "") -> list[str]:
        """`pip_calls` of one install of the project with `extras`."""
        return [f"{self.root}[{extras}]" if extras else str(self.root)]


@pytest.fixture
def checkout(tmp_path: Path) -> Checkout:
    return Checkout(tmp_path)


def test_the_first_run_says_it_installs_and_keeps_pips_output_in_a_log(
    checkout: Checkout,
) -> None:
    """One line before pip starts and one when it is done, on stderr; setuptools' warning
    banner about the editable install goes to .venv/pip-install.log only."""
    done = checkout.run("run.sh", "--port", "0")
    assert done.returncode == 0, done.stderr
    assert checkout.pip_calls() == checkout.installs()
    assert done.stdout == "mpbroker serve --port 0\n"
    lines = done.stderr.splitlines()
    assert lines[0] == (
        f"installing mpbroker into {checkout.venv} (up to a few minutes the first time)..."
    )
    assert lines[1].startswith("installed mpbroker in ")
    assert len(lines) == 2, done.stderr
    log = (checkout.venv / "pip-install.log").read_text(encoding="utf-8")
    for noise in SETUPTOOLS_NOISE:
        assert noise in log
        assert noise not in done.stderr + done.stdout

    again = checkout.run("run.sh")
    assert again.returncode == 0, again.stderr
    assert checkout.pip_calls() == []
    assert again.stderr == ""
    assert again.stdout == "mpbroker serve\n"


def test_run_and_test_one_after_the_other_install_once(checkout: Checkout) -> None:
    """A venv with more extras than a script needs will do; a missing extra installs the
    extras of both, and a changed pyproject.toml installs again what was there."""
    first = checkout.run("test.sh", "-q")
    assert first.returncode == 0, first.stderr
    assert checkout.pip_calls() == checkout.installs("test")
    assert "installing mpbroker[test] into" in first.stderr
    assert first.stdout.splitlines()[-1] == "pytest -n 2 --dist loadfile -q"

    for script in ("run.sh", "test.sh", "run.sh"):
        done = checkout.run(script)
        assert done.returncode == 0, done.stderr
        assert checkout.pip_calls() == [], script
        assert done.stderr == ""

    spark = checkout.run("run.sh", MPBROKER_EXTRAS="spark")
    assert spark.returncode == 0, spark.stderr
    assert checkout.pip_calls() == checkout.installs("spark,test")
    for script, extras in (("test.sh", ""), ("run.sh", "spark"), ("run.sh", "test, spark")):
        checkout.run(script, MPBROKER_EXTRAS=extras)
        assert checkout.pip_calls() == [], (script, extras)

    pyproject = checkout.root / "pyproject.toml"
    pyproject.write_text(pyproject.read_text(encoding="utf-8") + "# changed\n", encoding="utf-8")
    changed = checkout.run("run.sh")
    assert changed.returncode == 0, changed.stderr
    assert checkout.pip_calls() == checkout.installs("spark,test")
    checkout.run("run.sh")
    assert checkout.pip_calls() == []


def test_a_stamp_of_the_old_kind_installs_again(checkout: Checkout) -> None:
    """The stamp an earlier _venv.sh wrote (pyproject.toml, then the extras) is not taken
    for a list of extras."""
    checkout.run("run.sh")
    stamp = checkout.venv / ".mpbroker-installed"
    stamp.write_text(PYPROJECT.read_text(encoding="utf-8") + "test", encoding="utf-8")
    checkout.run("run.sh")
    assert checkout.pip_calls() == checkout.installs()


def test_a_failed_install_shows_the_end_of_pips_log_and_stops(checkout: Checkout) -> None:
    """The end of the log, then one line saying what failed; the broker is not started, and
    the next run installs again (a failed pip may have left the venv half-changed)."""
    checkout.run("run.sh")
    pyproject = checkout.root / "pyproject.toml"
    before = pyproject.read_text(encoding="utf-8")
    pyproject.write_text(before + "# changed\n", encoding="utf-8")
    failed = checkout.run("run.sh", PIP_FAILS="1")
    assert failed.returncode == 1
    assert failed.stdout == ""  # mpbroker serve never ran
    lines = failed.stderr.splitlines()
    assert lines[0].startswith("installing mpbroker into")
    assert "ERROR: No matching distribution found for trio>=0.25" in lines
    log = checkout.venv / "pip-install.log"
    assert lines[-1] == (
        f"could not install mpbroker into {checkout.venv}: pip failed (above, the end of {log})"
    )

    pyproject.write_text(before, encoding="utf-8")
    again = checkout.run("run.sh")
    assert again.returncode == 0, again.stderr
    assert checkout.pip_calls() == checkout.installs()
    assert again.stdout == "mpbroker serve\n"
