"""A real headless Chromium for tests of pages (Debian's `chromium` and `chromium-driver`,
driven by selenium): the dashboard, and stomp.js in a browser.

`chromium()` starts one and quits it (its processes, and its profile in a temp dir) at the
end; `console_errors` is what the page wrote to the console at level SEVERE, which is also
where Chromium reports a failed request and an uncaught exception.
"""

from __future__ import annotations

import base64
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

__all__ = ["chromium", "console_errors", "with_basic_auth"]

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


@contextmanager
def chromium(
    width: int = 1366, height: int = 900, arguments: tuple[str, ...] = ()
) -> Iterator[webdriver.Chrome]:
    """A headless Chromium at a laptop's screen size (with more command-line `arguments`,
    e.g. `--ignore-certificate-errors` for a test CA's server). Its profile is a temp dir
    of its own, and `--disable-dev-shm-usage` keeps it out of /dev/shm (which the broker's
    tests check is left clean)."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(path) is None:
            raise RuntimeError(f"{path} is missing: apt-get install chromium chromium-driver")
    with tempfile.TemporaryDirectory(prefix="mpbroker-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for argument in (
            "--headless=new",
            "--no-sandbox",  # as root (CI) Chromium refuses to start with its sandbox
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-extensions",
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            *arguments,
        ):
            options.add_argument(argument)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        try:
            yield driver
        finally:
            driver.quit()


def console_errors(driver: webdriver.Chrome) -> list[str]:
    """The console's SEVERE entries since the last call (each is read once)."""
    # (cast: selenium leaves get_log untyped)
    entries: list[dict[str, Any]] = cast(Any, driver).get_log("browser")
    return [entry["message"] for entry in entries if entry.get("level") == "SEVERE"]


def with_basic_auth(driver: webdriver.Chrome, user: str, password: str) -> None:
    """Send HTTP Basic credentials with every request of `driver` from now on (what a
    person types into the browser's prompt once)."""
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd(
        "Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Basic {token}"}}
    )
