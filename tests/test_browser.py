"""The headless Chromium the page tests use works on this machine: a page's script runs,
and what it writes to the console as an error is seen."""

from __future__ import annotations

import pytest

from tests.browser import chromium, console_errors

pytestmark = pytest.mark.slow


def test_a_page_runs_and_its_console_errors_are_seen() -> None:
    with chromium() as driver:
        driver.get("data:text/html,<title>t</title><script>console.error('boom')</script>")
        assert driver.title == "t"
        assert driver.execute_script("return 6 * 7") == 42
        assert any("boom" in line for line in console_errors(driver))
