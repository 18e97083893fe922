"""Fixtures of the shared-memory tests.

Every test gets its own broker instance string, ``<pytest pid>t<n>``: it has no lock file and
starts with a live pid (ours), so a concurrent sweep_stale() leaves it alone, and the suffix
keeps tests apart. After the test, nothing of that instance may remain in /dev/shm.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

from mpbroker.shm import SHM_DIR, remove_instance

_counter = itertools.count()


def _leftovers(instance: str) -> list[str]:
    prefixes = (f"mpb.{instance}.", f"sem.mpb.{instance}.")
    return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(prefixes))


@pytest.fixture(autouse=True)
def instance() -> Iterator[str]:
    """A unique broker instance for this test; asserts the test removed all its entries."""
    name = f"{os.getpid()}t{next(_counter)}"
    yield name
    left = _leftovers(name)
    # Remove them anyway, so one leaking test does not make the next ones fail too.
    remove_instance(name)
    assert not left, f"test left shared-memory entries behind: {left}"
