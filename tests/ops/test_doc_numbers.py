"""Numbers the docs state about the code, checked against it so that they cannot drift: how
many hot modules a wheel compiles (mpbroker/native.py lists them for setup.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mpbroker import native

DOCS = Path(__file__).resolve().parents[2] / "docs"


def words(doc: str) -> str:
    """The text of docs/`doc`, its line breaks as spaces."""
    return " ".join((DOCS / doc).read_text(encoding="utf-8").split())


def test_the_docs_count_the_modules_setup_py_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """operations.md says how many modules are compiled and quotes the broker's log line
    about them; architecture.md says how many there are."""
    count = str(len(native.HOT_MODULES))
    operations = words("operations.md")
    assert re.findall(r"`ops/install.sh` compile the (\d+) modules", operations) == [count]
    # The line the broker logs when every hot module is compiled.
    monkeypatch.setattr(native, "compiled_modules", lambda: list(native.HOT_MODULES))
    logged = re.findall(r"`running (hot modules compiled with mypyc \(\d+\))`", operations)
    assert logged == [native.describe()]
    assert re.findall(r"The (\d+) modules every message", words("architecture.md")) == [count]
