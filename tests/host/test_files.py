"""Raising the open-file limit to what broker.max_connections needs."""

from __future__ import annotations

import resource
import subprocess
import sys


def run(script: str, soft: int, hard: int) -> str:
    """`script` in a child process started with these limits (ours are left alone)."""
    code = (
        "import resource\n"
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard}))\n"
        "from mpbroker.host import raise_open_files\n" + script
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return done.stdout.strip()


# Ours: a child may lower its hard limit, never raise it.
_, HARD = resource.getrlimit(resource.RLIMIT_NOFILE)
HIGH = 8192 if HARD == resource.RLIM_INFINITY else min(HARD, 8192)


def test_the_soft_limit_is_raised_to_what_is_needed() -> None:
    out = run(
        "print(raise_open_files(5000), resource.getrlimit(resource.RLIMIT_NOFILE))", 1024, HIGH
    )
    assert out == f"None (5000, {HIGH})"


def test_a_limit_that_is_enough_is_never_lowered() -> None:
    out = run(
        "print(raise_open_files(100), resource.getrlimit(resource.RLIMIT_NOFILE))", 4096, HIGH
    )
    assert out == f"None (4096, {HIGH})"


def test_a_hard_limit_too_low_is_named_and_the_soft_one_raised_to_it() -> None:
    assert HIGH >= 5000  # the machine allows the limits these tests set
    out = run(
        "print(raise_open_files(11024))\nprint(resource.getrlimit(resource.RLIMIT_NOFILE))",
        1024,
        4096,
    )
    warning, limits = out.splitlines()
    assert limits == "(4096, 4096)"
    assert warning.startswith(
        "open files: broker.max_connections needs up to 11,024 descriptors in a gateway, but "
        "the hard limit is 4,096"
    )
    assert "raise LimitNOFILE= in the unit" in warning
