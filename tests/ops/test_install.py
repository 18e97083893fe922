"""Installing mpbroker outside a checkout: a wheel built from it runs in a fresh venv, and
ops/install.sh lays out a service (venv, units, config) under --root and keeps a config on
a second run. The installs come from PyPI (through pip's cache), so they are slow."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

from mpbroker.harness import STOP_TIMEOUT_S, RawClient, ServerProcess
from mpbroker.shm import SHM_DIR

CHECKOUT = Path(__file__).resolve().parents[2]
INSTALL_SH = CHECKOUT / "ops" / "install.sh"
# Generous bounds for a venv and an install from pip's cache (or PyPI on a cold cache).
INSTALL_TIMEOUT_S = 600
RUN_TIMEOUT_S = 60
# What a copy of the checkout leaves out: the .gitignore list and the history.
NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    ".venv",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
    "mpbroker-data",
)


def run(
    *argv: str | Path, timeout: float = RUN_TIMEOUT_S, cwd: Path | str = "/", **env: str
) -> str:
    """Run a command to its end in the test's own environment plus `env`, in `cwd` (by
    default /, so that `python -c` cannot import the checkout's package from the working
    directory); its stdout, or a failure with both outputs if it exits non-zero."""
    result = subprocess.run(
        [str(arg) for arg in argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env},
        cwd=cwd,
    )
    assert result.returncode == 0, (
        f"{argv} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    )
    return result.stdout


def shm_of(pid: int) -> list[str]:
    """The /dev/shm entries of the broker whose supervisor is `pid`."""
    prefixes = (f"mpb.{pid}.", f"sem.mpb.{pid}.")
    return sorted(name for name in os.listdir(SHM_DIR) if name.startswith(prefixes))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from a copy of the checkout (so the checkout gets no build/), with the
    hot modules compiled when there is a C compiler: built once, for the tests of this
    module (compiling takes a minute or more)."""
    if importlib.util.find_spec("build") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the build package is missing in CI: add it to the test extras")
        pytest.skip("the build package is not installed (pip install build)")
    started = time.monotonic()
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(CHECKOUT, src, ignore=NOT_SOURCE)
    dist = tmp / "dist"
    run(sys.executable, "-m", "build", "--wheel", "--outdir", dist, src, timeout=INSTALL_TIMEOUT_S)
    wheels = sorted(dist.glob("mpbroker-*.whl"))
    assert len(wheels) == 1, wheels
    print(f"timings: wheel {time.monotonic() - started:.1f} s")
    return wheels[0]


@pytest.mark.slow
def test_wheel_installs_and_serves(tmp_path: Path, wheel: Path) -> None:
    """Install the wheel into a fresh venv, and run the broker from there: ready, then
    SIGTERM, exit 0, /dev/shm clean."""
    timings: dict[str, float] = {}
    started = time.monotonic()
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv, timeout=INSTALL_TIMEOUT_S)
    python = venv / "bin" / "python"
    run(python, "-m", "pip", "install", "--quiet", wheel, timeout=INSTALL_TIMEOUT_S)
    timings["venv and install"] = time.monotonic() - started

    started = time.monotonic()
    # The installed package, not the checkout's, is what runs.
    where = run(python, "-c", "import mpbroker; print(mpbroker.__file__)")
    assert Path(where.strip()).is_relative_to(venv), where
    assert "serve" in run(venv / "bin" / "mpbroker", "--help")
    broker = ServerProcess(
        "mpbroker from the wheel",
        [
            str(venv / "bin" / "mpbroker"),
            "serve",
            "--port",
            "0",
            "--admin-port",
            "0",
            "--data-dir",
            str(tmp_path / "data"),
        ],
    )
    compiler = shutil.which("cc") or shutil.which("gcc")
    version = run(venv / "bin" / "mpbroker", "--version")
    if compiler:
        # setup.py compiled the hot modules into the wheel (mypyc, with the C compiler).
        assert "hot modules compiled with mypyc" in version, version
    try:
        broker.start()
        assert "mpbroker ready on" in broker.log_text()
        if compiler:
            assert "running hot modules compiled with mypyc" in broker.log_text()
        carry_messages(broker.port)
        # The dashboard's static files are package data: the wheel serves them too.
        admin = re.search(r"admin API on (http://\S+:\d+)", broker.log_text())
        assert admin is not None, broker.log_text()
        for path, expected in (
            ("/", b"/static/dashboard.js"),
            ("/static/dashboard.js", b"refresh"),
        ):
            with urllib.request.urlopen(admin.group(1) + path, timeout=10) as reply:
                assert expected in reply.read()
        pid = broker.pid
        os.kill(pid, signal.SIGTERM)
        assert broker.process is not None
        assert broker.process.wait(STOP_TIMEOUT_S) == 0, broker.tail()
    finally:
        broker.stop()  # reaps and closes the pipe; kills the broker if the test failed
    assert shm_of(pid) == []
    timings["serve and stop"] = time.monotonic() - started
    print("timings:", ", ".join(f"{what} {took:.1f} s" for what, took in timings.items()))


@pytest.mark.slow
def test_a_wheel_without_a_working_compiler_is_pure_python(tmp_path: Path) -> None:
    """Compiling the hot modules is never required: when the C compiler fails, the build
    says so and the wheel holds the pure-Python modules only (and so works anywhere)."""
    if importlib.util.find_spec("build") is None:
        pytest.skip("the build package is not installed (pip install build)")
    src = tmp_path / "src"
    shutil.copytree(CHECKOUT, src, ignore=NOT_SOURCE)
    dist = tmp_path / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(src)],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        env={**os.environ, "CC": "false"},
        cwd="/",
    )
    assert built.returncode == 0, built.stdout + built.stderr
    out = built.stdout + built.stderr
    assert "compiling the hot modules failed, pure-Python modules only" in out
    (wheel,) = dist.glob("mpbroker-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert "mpbroker/stomp/_parser.py" in names
    for name in ("index.html", "dashboard.js", "dashboard.css"):
        assert f"mpbroker/admin/static/{name}" in names
    assert [name for name in names if name.endswith(".so")] == []


def carry_messages(port: int) -> None:
    """Messages through a queue (a receipt, acks), a topic to two subscribers and a
    persistent queue, each checked exactly: the compiled modules carry them all."""
    producer, consumer = RawClient("127.0.0.1", port), RawClient("127.0.0.1", port)
    try:
        producer.connect()
        consumer.connect()
        consumer.send("SUBSCRIBE", {"id": "q", "destination": "/queue/w", "ack": "client"})
        consumer.send("SUBSCRIBE", {"id": "t1", "destination": "/topic/w"})
        consumer.send("SUBSCRIBE", {"id": "t2", "destination": "/topic/w", "receipt": "s"})
        consumer.expect("RECEIPT", "s")
        for n in range(300):
            producer.send("SEND", {"destination": "/queue/w"}, b"q%d" % n)
            producer.send("SEND", {"destination": "/topic/w"}, b"t%d" % n)
            persistent = {"destination": "/queue/p", "persistent": "true"}
            producer.send("SEND", persistent, b"p%d" % n)
        producer.send("DISCONNECT", {"receipt": "sent"})
        producer.expect("RECEIPT", "sent")
        got: dict[str, list[bytes]] = {"q": [], "t1": [], "t2": []}
        while sum(map(len, got.values())) < 900:
            frame = consumer.expect("MESSAGE")
            got[frame.headers["subscription"]].append(frame.body)
            if frame.headers["subscription"] == "q":
                consumer.send("ACK", {"id": frame.headers["ack"]})
        assert got == {
            "q": [b"q%d" % n for n in range(300)],
            "t1": [b"t%d" % n for n in range(300)],
            "t2": [b"t%d" % n for n in range(300)],
        }
        consumer.send("SUBSCRIBE", {"id": "p", "destination": "/queue/p"})
        stored = [consumer.expect("MESSAGE").body for _ in range(300)]
        assert stored == [b"p%d" % n for n in range(300)]
    finally:
        producer.close()
        consumer.close()


@pytest.mark.slow
def test_install_sh_into_a_root(tmp_path: Path, wheel: Path) -> None:
    """install.sh --root --wheel, run in the checkout's root as the docs say: the venv runs,
    the units name the prefix, the config is there (0640), the script reports the compiled
    modules it installed (not the checkout's pure-Python package, which a Python started in
    the checkout would import); a second run from the checkout (an upgrade) keeps a config
    the user edited."""
    root = tmp_path / "root"
    # Not the default prefix, so that its substitution in the units shows.
    prefix = "/usr/local/mpbroker"
    venv = Path(f"{root}{prefix}")
    timings: dict[str, float] = {}

    def install(run_name: str, *argv: str | Path, **env: str) -> str:
        started = time.monotonic()
        out = run(
            "bash",
            INSTALL_SH,
            "--root",
            root,
            "--prefix",
            prefix,
            *argv,
            timeout=INSTALL_TIMEOUT_S,
            cwd=CHECKOUT,
            PYTHON=sys.executable,
            **env,
        )
        timings[run_name] = time.monotonic() - started
        return out

    # The wheel the other test installs (building it from the checkout here would compile
    # the hot modules a second time).
    out = install("first run", "--wheel", wheel)
    for skipped in ("creating the user mpbroker", "chown", "systemctl daemon-reload"):
        assert f"--root: skipped {skipped}" in out, out
    assert "systemctl enable --now mpbroker" in out
    # pip hides the build's output, so the script says what it installed.
    if shutil.which("cc") or shutil.which("gcc"):
        assert "installed mpbroker 0.1.0, hot modules compiled with mypyc" in out, out

    # The scripts name PREFIX (where the tree will be copied), so run them by the venv's
    # python, which is a link to the interpreter the venv was made with.
    mpbroker = venv / "bin" / "mpbroker"
    assert mpbroker.read_text(encoding="utf-8").startswith(f"#!{prefix}/bin/python\n")
    assert run(venv / "bin" / "python", mpbroker, "--version").startswith("mpbroker ")

    units = root / "etc" / "systemd" / "system"
    for unit in [*CHECKOUT.glob("ops/*.service"), *CHECKOUT.glob("ops/*.timer")]:
        installed = (units / unit.name).read_text(encoding="utf-8")
        assert installed == unit.read_text(encoding="utf-8").replace("/opt/mpbroker", prefix)
    assert f"ExecStart={prefix}/bin/mpbroker serve" in (units / "mpbroker.service").read_text(
        encoding="utf-8"
    )

    config = root / "etc" / "mpbroker" / "mpbroker.toml"
    assert config.read_text(encoding="utf-8") == (CHECKOUT / "ops" / "mpbroker.toml").read_text(
        encoding="utf-8"
    )
    assert stat.S_IMODE(config.stat().st_mode) == 0o640

    edited = config.read_text(encoding="utf-8") + '\n[broker]\nhost = "0.0.0.0"\n'
    config.write_text(edited, encoding="utf-8")
    # The upgrade, from the checkout, is pure Python (MPBROKER_PURE=1): it need not compile
    # the modules again (the wheel has them), and it shows that an upgrade leaves none of
    # the old compiled modules behind to shadow the new sources.
    out = install("second run", MPBROKER_PURE="1")
    assert f"kept the config {config}" in out, out
    assert "installed mpbroker 0.1.0, pure Python (hot modules not compiled)" in out, out
    assert config.read_text(encoding="utf-8") == edited
    assert run(venv / "bin" / "python", mpbroker, "--version").startswith(
        "mpbroker 0.1.0, pure Python"
    )
    print("timings:", ", ".join(f"{what} {took:.1f} s" for what, took in timings.items()))


def install_sh(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(INSTALL_SH), *argv], capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--bogus"], "unknown argument: --bogus"),
        (["--prefix"], "--prefix needs a value"),
        (["--prefix", "relative/path"], "--prefix must be an absolute path"),
        (["--extras", "spark;rm"], "--extras must be"),
        (["--wheel", "/nonexistent/mpbroker.whl"], "--wheel must name a wheel file"),
        (["--wheel", "ops/install.sh"], "--wheel must name a wheel file"),
    ],
)
def test_install_sh_refuses_bad_arguments(argv: list[str], says: str) -> None:
    """Refused before anything is written, with exit code 2."""
    result = install_sh(*argv)
    assert result.returncode == 2, result.stderr
    assert says in result.stderr


def test_install_sh_needs_root_without_root_dir() -> None:
    """Not root and no --root: refused with exit code 2, before anything is written."""
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root and setpriv (util-linux) is missing")
        # As nobody, who may not be able to reach the checkout: the script comes on stdin.
        argv = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "bash", "-s"]
    else:
        argv = ["bash", "-s"]
    with INSTALL_SH.open(encoding="utf-8") as script:
        result = subprocess.run(
            argv, stdin=script, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd="/"
        )
    assert result.returncode == 2, result.stderr
    assert "must run as root" in result.stderr
