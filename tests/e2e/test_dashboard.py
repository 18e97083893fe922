"""The dashboard (`GET /` of the admin API) in a real headless Chromium against a real
broker: it loads with no console errors, shows a queue and its backlog and follows it as it
grows, sorts, filters and pages 300 destinations, works behind the admin API's
credentials (typed at the prompt, or in the address), and shows what a durable subscriber
that is away has waiting. The loaded page, with some traffic, is saved as a screenshot under pytest's
basetemp (`artifacts/dashboard.png`) for a person to look at."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from mpbroker.client import connect
from mpbroker.harness import BrokerProcess, RawClient
from mpbroker.stomp import Frame, encode_frame
from tests.browser import chromium, console_errors, with_basic_auth
from tests.e2e._admin import ask, user_add

pytestmark = pytest.mark.slow

# The page refreshes every 3 s and the workers publish every 500 ms: a change shows within
# two refreshes; the bound is generous for a loaded CI machine.
TIMEOUT_S = 20
_T = TypeVar("_T")

ROWS_JS = """
return Array.from(document.querySelectorAll('#destinations tbody tr'),
                  tr => Array.from(tr.cells, td => td.textContent));
"""


def rows(driver: webdriver.Chrome) -> list[list[str]]:
    """The destinations table's rows, as the cells' text."""
    found: list[list[str]] = driver.execute_script(ROWS_JS)
    return found


def wait(driver: webdriver.Chrome, check: Callable[[webdriver.Chrome], _T]) -> _T:
    """The first truthy result of `check`, asked again every 0.2 s."""
    result: _T = WebDriverWait(driver, TIMEOUT_S, poll_frequency=0.2).until(check)
    return result


def backlog_of(driver: webdriver.Chrome, name: str) -> str | None:
    """The Backlog column of the row of `name` (None while it is not shown)."""
    for cells in rows(driver):
        if cells[0] == name:
            return cells[2]
    return None


def text(driver: webdriver.Chrome, element_id: str) -> str:
    value: str = driver.find_element(By.ID, element_id).text
    return value


def send(broker: BrokerProcess, destination: str, count: int) -> None:
    """`count` messages to `destination`, the last with a receipt (so all arrived)."""
    with connect(broker.host, broker.port) as conn:
        for n in range(count):
            conn.send(destination, f"message {n}", receipt=n == count - 1)


@pytest.fixture(scope="module")
def driver() -> Iterator[webdriver.Chrome]:
    with chromium() as browser:
        yield browser


@pytest.fixture(scope="module")
def dashboard_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with BrokerProcess(gateways=1, data_dir=tmp_path_factory.mktemp("dashboard") / "data") as b:
        yield b


def screenshot_path(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    folder = tmp_path_factory.getbasetemp() / "artifacts"
    folder.mkdir(exist_ok=True)
    return folder / name


def test_the_page_shows_a_queue_and_its_backlog_and_follows_it(
    driver: webdriver.Chrome,
    dashboard_broker: BrokerProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    send(dashboard_broker, "/queue/dash.watched", 3)
    send(dashboard_broker, "/queue/dash.<b>bold</b>", 1)  # shown as text, never as HTML
    driver.get(f"{dashboard_broker.admin_url}/")
    assert driver.title == "mpbroker dashboard"
    assert wait(driver, lambda d: backlog_of(d, "/queue/dash.watched") == "3")
    send(dashboard_broker, "/queue/dash.watched", 4)
    assert wait(driver, lambda d: backlog_of(d, "/queue/dash.watched") == "7")
    assert backlog_of(driver, "/queue/dash.<b>bold</b>") == "1"
    assert driver.find_elements(By.CSS_SELECTOR, "#destinations tbody b") == []
    # The deepest backlog first (the default sort), and the rest of the row.
    row = rows(driver)[0]
    assert row[:6] == ["/queue/dash.watched", "queue", "7", "7", "0", "0"]
    assert row[8:] == ["flowing", "p2p 0"]
    # The workers, each with its memory once MemWatch read it (every second).
    assert wait(driver, lambda d: "MiB" in text(d, "workers"))
    assert text(driver, "workers-ready") == "4 / 4"
    assert "of max_memory used" in text(driver, "memory-text")
    # Some traffic for the chart: a consumer takes the messages, over a few refreshes.
    with connect(dashboard_broker.host, dashboard_broker.port) as conn:
        sub = conn.subscribe("/queue/dash.watched", ack="auto")
        for _ in range(7):
            sub.get(timeout=10)
        for n in range(3):
            send(dashboard_broker, "/queue/dash.flowing", 50 * (n + 1))
            wait(driver, lambda d: backlog_of(d, "/queue/dash.watched") == "0")
    assert wait(driver, lambda d: backlog_of(d, "/queue/dash.flowing") == "300")
    assert console_errors(driver) == []
    assert driver.find_element(By.ID, "banner").get_attribute("hidden") is not None
    path = screenshot_path(tmp_path_factory, "dashboard.png")
    driver.set_window_size(1366, 1300)  # the whole page, at a laptop's width
    try:
        assert driver.save_screenshot(str(path))
    finally:
        driver.set_window_size(1366, 900)
    print(f"dashboard screenshot: {path}")


def fill(broker: BrokerProcess, count: int) -> None:
    """Queues dash.many.000 .. dash.many.<count-1>; queue n holds n % 7 + 1 messages."""
    producer = RawClient(broker.host, broker.port, timeout=60)
    try:
        producer.connect()
        producer.send_bytes(
            b"".join(
                encode_frame(Frame("SEND", {"destination": f"/queue/dash.many.{n:03d}"}, b"x"))
                for n in range(count)
                for _ in range(n % 7 + 1)
            )
        )
        producer.send("DISCONNECT", {"receipt": "done"})
        producer.expect("RECEIPT", "done")
    finally:
        producer.close()


def click_header(driver: webdriver.Chrome, key: str) -> None:
    driver.find_element(By.CSS_SELECTOR, f'#destinations th[data-sort="{key}"] button').click()


def test_filter_sort_and_paging_with_300_destinations(
    driver: webdriver.Chrome, dashboard_broker: BrokerProcess
) -> None:
    fill(dashboard_broker, 300)
    driver.get(f"{dashboard_broker.admin_url}/")
    filter_box = driver.find_element(By.ID, "filter")
    filter_box.send_keys("DASH.MANY")  # any case
    assert wait(
        driver, lambda d: text(d, "page-info") == 'showing 1\u201325 of 300 matching "DASH.MANY"'
    )
    # Deepest first: the 42 queues with 7 messages (n % 7 == 6), in name order.
    shown = rows(driver)
    assert [cells[2] for cells in shown] == ["7"] * 25
    assert [cells[0] for cells in shown[:2]] == ["/queue/dash.many.006", "/queue/dash.many.013"]
    # Another column, then the same one again: the other way.
    click_header(driver, "name")
    assert wait(driver, lambda d: rows(d)[0][0] == "/queue/dash.many.000")
    click_header(driver, "name")
    assert wait(driver, lambda d: rows(d)[0][0] == "/queue/dash.many.299")
    sort = driver.find_element(By.CSS_SELECTOR, '#destinations th[data-sort="name"]')
    assert sort.get_attribute("aria-sort") == "descending"
    # Pages: 100 a page, the next one, the last one.
    Select(driver.find_element(By.ID, "page-size")).select_by_value("100")
    assert wait(driver, lambda d: len(rows(d)) == 100)
    driver.find_element(By.ID, "next-page").click()
    assert wait(driver, lambda d: text(d, "page-info").startswith("showing 101\u2013200 of 300"))
    assert rows(driver)[0][0] == "/queue/dash.many.199"
    driver.find_element(By.ID, "next-page").click()
    assert wait(driver, lambda d: text(d, "page-info").startswith("showing 201\u2013300 of 300"))
    assert driver.find_element(By.ID, "next-page").get_attribute("disabled") is not None
    # A narrower filter starts again at the first page.
    filter_box.clear()
    filter_box.send_keys("many.12")
    assert wait(
        driver, lambda d: text(d, "page-info") == 'showing 1\u201310 of 10 matching "many.12"'
    )
    assert [cells[0] for cells in rows(driver)][:2] == [
        "/queue/dash.many.129",
        "/queue/dash.many.128",
    ]
    # The page's state survived the refreshes in between.
    assert driver.find_element(By.ID, "filter").get_attribute("value") == "many.12"
    assert console_errors(driver) == []


def test_the_page_works_with_the_admin_apis_credentials(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = tmp_path_factory.mktemp("dashboard-auth")
    users = root / "users"
    user_add(users, "ops", "0ps-pw", "admin")
    config = f'[security]\nusers_file = "{users}"\n'
    with BrokerProcess(gateways=1, config=config, data_dir=root / "data") as broker:
        # Without credentials: 401 and the challenge a browser prompts for.
        for path in ("/", "/static/dashboard.js"):
            code, headers, _ = ask(broker, path)
            assert (code, headers["WWW-Authenticate"]) == (
                401,
                'Basic realm="mpbroker", charset="UTF-8"',
            )
        with connect(broker.host, broker.port, login="ops", passcode="0ps-pw") as conn:
            conn.send("/queue/dash.secured", "x", receipt=True)
        with chromium() as browser:
            with_basic_auth(browser, "ops", "0ps-pw")
            browser.get(f"{broker.admin_url}/")
            assert wait(browser, lambda d: backlog_of(d, "/queue/dash.secured") == "1")
            assert console_errors(browser) == []
        # Credentials in the address, as a person may type them (or a bookmark keeps
        # them): the browser logs in with them and caches them for the origin, but the
        # page's base URL keeps them, and Chromium refuses to make a request from a URL
        # that holds credentials. The page must ask its pages by the origin alone.
        with chromium() as browser:
            assert broker.admin_url is not None
            browser.get(broker.admin_url.replace("http://", "http://ops:0ps-pw@") + "/")
            assert wait(browser, lambda d: backlog_of(d, "/queue/dash.secured") == "1")
            assert wait(browser, lambda d: text(d, "workers-ready") == "4 / 4")
            assert browser.find_element(By.ID, "banner").get_attribute("hidden") is not None
            assert console_errors(browser) == []


def test_the_page_says_when_a_refresh_fails(
    driver: webdriver.Chrome, dashboard_broker: BrokerProcess
) -> None:
    """A poll that fails shows a banner (and the next good one hides it)."""
    driver.get(f"{dashboard_broker.admin_url}/")
    assert wait(driver, lambda d: text(d, "last-refresh") != "never")
    # Every request to /flow fails from now on (the browser refuses to send it).
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*/flow?*"]})
    try:
        banner = wait(driver, lambda d: text(d, "banner"))
        assert banner.startswith("Refresh failed: cannot reach the admin API")
    finally:
        driver.execute_cdp_cmd("Network.setBlockedURLs", {"urls": []})
    assert wait(driver, lambda d: d.find_element(By.ID, "banner").get_attribute("hidden"))
    # The blocked requests are Chromium's own console lines, not the page's exceptions.
    assert not [line for line in console_errors(driver) if "Uncaught" in line]


DURABLE_JS = """
return Array.from(document.querySelectorAll('#durable tbody tr'),
                  tr => Array.from(tr.cells, td => td.textContent));
"""


def test_a_durable_subscriber_away_shows_its_backlog(
    driver: webdriver.Chrome, dashboard_broker: BrokerProcess
) -> None:
    """Persistent messages stored for a durable subscriber that is away: in its row of the
    durable subscriptions, and in its topic's backlog (in no live buffer: counted by the
    replay worker every 5 s)."""
    durable = {"activemq.subscriptionName": "away"}
    with connect(dashboard_broker.host, dashboard_broker.port, client_id="dash") as conn:
        conn.subscribe("/topic/dash.durable", headers=durable, receipt=True)
    with connect(dashboard_broker.host, dashboard_broker.port) as conn:
        for n in range(3):
            conn.send("/topic/dash.durable", f"d{n}", {"persistent": "true"}, receipt=True)
        conn.send("/topic/dash.durable", "kept in memory", receipt=True)
    driver.get(f"{dashboard_broker.admin_url}/")
    driver.find_element(By.ID, "filter").send_keys("dash.durable")

    def durable_rows(d: webdriver.Chrome) -> list[list[str]]:
        found: list[list[str]] = d.execute_script(DURABLE_JS)
        return found

    assert wait(
        driver,
        lambda d: (
            durable_rows(d) == [["dash/away", "/topic/dash.durable", "inactive", "4", "pubsub 0"]]
        ),
    )
    assert wait(driver, lambda d: backlog_of(d, "/topic/dash.durable") == "4")
    [row] = rows(driver)
    # Backlog and waiting: 3 stored and 1 kept; no subscriber now.
    assert row[:6] == ["/topic/dash.durable", "topic", "4", "4", "\u2013", "0"]
    assert console_errors(driver) == []
