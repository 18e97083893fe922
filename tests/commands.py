"""Running ``python -m MODULE ...`` to its end from tests, as a person would (the load
generator, the bench studies), and asking whether a process is gone afterwards."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

import pytest

# Generous bound for one bench invocation; a hang fails the test instead of hanging it.
RUN_TIMEOUT_S = 120


def run_module(module: str, *argv: str) -> tuple[int, str, str]:
    """`python -m module argv...` to its end: exit status, stdout, stderr. A session of its
    own, so that if it hangs, killing its process group also ends the broker and the
    producer and consumer processes it started."""
    process = subprocess.Popen(
        [sys.executable, "-m", module, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"{module} did not finish within {RUN_TIMEOUT_S} s:\n{out}\n{err}")
    return process.returncode, out, err


def run_module_json(module: str, *argv: str) -> tuple[int, dict[str, Any], str]:
    """`run_module` for a bench that prints its summary as JSON on its last line."""
    code, out, err = run_module(module, *argv)
    lines = out.strip().splitlines()
    assert lines, f"no output; stderr:\n{err}"
    summary: dict[str, Any] = json.loads(lines[-1])
    return code, summary, err


def gone(pid: int) -> bool:
    """Whether no process has id ``pid`` (our children are reaped by the time we ask)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# `mpbroker export` run in the test process (cli.main) rather than as a process of its own:
# --max-memory bounds the whole process, and pytest's (with Spark's py4j and a broker
# harness) is far bigger than an export alone, which tests/export/test_memory.py measures.
EXPORT_IN_PROCESS = ("--max-memory", "8GiB")
