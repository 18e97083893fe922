"""A broker that cannot start says why in one line and exits with code 2, before anything
starts: no traceback, no worker's log, nothing left running or in /dev/shm. (A port in use:
tests/e2e/test_faults.py.) And the worker counts: 0 for every kind, and the partitions a
data dir was made with."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mpbroker.config import Config, load_config
from mpbroker.harness import BrokerProcess, RawClient
from mpbroker.host import usable_cpus
from mpbroker.memory import fit_workers
from tests.filesystems import small_tmpfs

pytestmark = pytest.mark.slow


def serve(*args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    command = [*prefix, sys.executable, "-m", "mpbroker", "serve", "--port", "0", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def load_config_text(text: str, where: Path) -> Config:
    path = where / "expected.toml"
    path.write_text(text)
    return load_config(path)


def refused(result: subprocess.CompletedProcess[str], line: str) -> None:
    assert result.returncode == 2, result.stderr
    assert result.stderr == line + "\n"


def test_an_admin_port_out_of_range_is_named(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    refused(
        serve("--admin-port", "70000", "--data-dir", data),
        "mpbroker: config: admin.port = 70000: must be an integer from -1 to 65535",
    )
    config = tmp_path / "broker.toml"
    config.write_text("[admin]\nport = 70000\n")
    refused(
        serve("--config", str(config), "--data-dir", data),
        "mpbroker: config: admin.port = 70000: must be an integer from -1 to 65535",
    )


def test_a_data_dir_that_is_a_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    refused(
        serve("--data-dir", str(tmp_path / "file")),
        f"mpbroker: data dir {tmp_path / 'file'}: not a directory",
    )


def test_a_data_dir_on_a_read_only_filesystem_is_named(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "ro", "1m", read_only=True) as mount:
        refused(
            serve("--data-dir", str(mount)),
            f"mpbroker: data dir {mount}: not writable (Read-only file system)",
        )


def test_a_data_dir_that_is_not_writable_is_named(tmp_path: Path) -> None:
    data = tmp_path / "theirs"
    data.mkdir()
    prefix: tuple[str, ...] = ()
    if os.geteuid() == 0:
        # Root writes anywhere: run without the capability that lets it, as another
        # user would be.
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("as root, this needs setpriv (util-linux) to drop CAP_DAC_OVERRIDE")
        os.chown(data, 65534, 65534)
        prefix = (setpriv, "--bounding-set=-dac_override,-dac_read_search")
    data.chmod(0o500)
    refused(
        serve("--data-dir", str(data), prefix=prefix),
        f"mpbroker: data dir {data}: not writable (Permission denied)",
    )


def test_every_kind_of_worker_one_per_cpu_and_the_partitions_kept(tmp_path: Path) -> None:
    """0 for every kind: one per usable CPU (with room for them in max_memory); the next
    start with 0 keeps the partitions, one with other explicit counts is refused."""
    cpus = usable_cpus().count
    config = (
        "[broker]\ngateways = 0\np2p_workers = 0\npubsub_workers = 0\n"
        "[replay]\nworkers = 0\n[memory]\nmax_memory = '2GiB'\n"
    )
    # One per usable CPU, unless a machine with many CPUs cannot fit them in 2 GiB.
    b = fit_workers(load_config_text(config, tmp_path), cpus).config
    expected = {"gateway": b.broker.gateways, "p2p": b.broker.p2p_workers}
    expected |= {"pubsub": b.broker.pubsub_workers, "replay": b.replay.workers}
    if cpus <= 4:
        assert set(expected.values()) == {cpus}
    data = tmp_path / "data"
    with BrokerProcess(config=config, data_dir=data) as broker:
        titles = sorted(broker.workers())
        assert titles == sorted(f"{kind} {i}" for kind, n in expected.items() for i in range(n))
        client = RawClient(broker.host, broker.port)
        try:
            client.connect()
            names = [f"/queue/spread.{i}" for i in range(8)] + [
                f"/topic/spread.{i}" for i in range(4)
            ]
            for i, name in enumerate(names):
                client.send("SUBSCRIBE", {"destination": name, "id": str(i), "ack": "auto"})
            for name in names:
                client.send("SEND", {"destination": name}, name.encode())
            got = sorted(client.recv().body.decode() for _ in names)
            assert got == sorted(names)
        finally:
            client.close()
    # A data dir made with one p2p worker keeps it under 0, whatever the CPUs...
    other = tmp_path / "other"
    with BrokerProcess("--log-level", "info", data_dir=other):
        pass
    with BrokerProcess(config=config, data_dir=other) as broker:
        assert sum(t.startswith("p2p") for t in broker.workers()) == 1
        assert sum(t.startswith("gateway") for t in broker.workers()) == expected["gateway"]
    # ...and other explicit counts are refused.
    explicit = tmp_path / "two.toml"
    explicit.write_text("[broker]\np2p_workers = 2\n")
    result = serve("--config", str(explicit), "--data-dir", str(other))
    assert result.returncode == 2
    assert result.stderr.startswith(
        "mpbroker: config: broker.p2p_workers = 2: the data dir's stores were made with 1 "
        "(recorded in mpbroker-partitions.json)"
    )


def test_under_journald_a_refused_start_is_filed_as_an_error(tmp_path: Path) -> None:
    """The line comes before logging is set up; it still gets the error priority, so that
    `journalctl -p err` shows why the broker did not start."""
    read_end, write_end = os.pipe()
    st = os.fstat(write_end)
    env = {**os.environ, "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
    command = [sys.executable, "-m", "mpbroker", "serve", "--admin-port", "70000"]
    process = subprocess.Popen(command, stderr=write_end, stdin=subprocess.DEVNULL, env=env)
    os.close(write_end)
    with os.fdopen(read_end) as stderr:
        text = stderr.read()
    assert process.wait(60) == 2
    assert text == "<3>mpbroker: config: admin.port = 70000: must be an integer from -1 to 65535\n"
