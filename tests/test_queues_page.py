"""The Queues page in headless Chromium, inside Airflow's UI served by a real api-server.

The api-server runs as its own process with Airflow's default auth manager (simple, with a user
and password), the provider installed and the queues' database as ``sqlqueue_default``. The
browser logs in through Airflow's login page, opens Queues from the navigation route, watches a
depth change after a send and retries a failed message, which leaves the error queue. A viewer (the
simple auth manager's viewer role: no rights on connections) watches the same queues read only: the
actions are disabled with the permission they need, the messages are not shown, and an action posted
anyway is refused with that permission named, while the admin's goes through. Screenshots (light and
dark theme, read only) go to ``test-artifacts/``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueClient
from demo.services import AirflowServices
from tests.conftest import EXAMPLE_DAGS

pytestmark = pytest.mark.timeout(600)

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
HOSTILE_BODY = "<img src=x onerror=\"document.title='owned'\">"
#: The api-server's users: the simple auth manager's admin, and a viewer (no rights on connections).
PASSWORDS = {"admin": "admin-secret", "viewer": "viewer-secret"}


@pytest.fixture(scope="module")
def api_server(pg_uri: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AirflowServices, str]]:
    if not (CHROMIUM and CHROMEDRIVER):
        message = "Debian's chromium and chromium-driver are needed (apt-get install chromium chromium-driver)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    home = tmp_path_factory.mktemp("airflow-ui")
    passwords = home / "passwords.json"
    passwords.write_text(json.dumps(PASSWORDS))
    schema = f"ui_{uuid.uuid4().hex[:8]}"
    with QueueClient.connect(pg_uri) as installer:
        installer.session.connection.execute(f'CREATE SCHEMA "{schema}"')
        installer.create_queue(QueueAddress("orders", schema))
    services = AirflowServices(
        home,
        f"sqlite:///{home / 'airflow.db'}",
        pg_uri,
        Path(EXAMPLE_DAGS),
        env={
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,viewer:viewer",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__SQLQUEUE__CONNECTIONS": "sqlqueue_default",
        },
    )
    try:
        services.migrate()
        services.start("api-server")
        deadline = time.monotonic() + 180
        while not services.health() and time.monotonic() < deadline:
            time.sleep(1)
        assert services.health(), f"api-server did not answer; see {services.logs}"
        yield services, schema
    finally:
        services.stop()
        with QueueClient.connect(pg_uri) as installer:
            installer.session.connection.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture
def browser() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-dev-shm-usage",
        "--window-size=1500,1100",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(condition, timeout: float = 60, what: str = "the page"):
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            found = condition()
            if found:
                return found
        except Exception as exc:  # the element may not be there yet, or be replaced while read
            last = exc
        time.sleep(0.25)
    raise AssertionError(f"{what} not seen within {timeout:.0f}s ({last})")


def login(driver, url: str, name: str = "admin") -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"{url}/")
    user = wait_for(lambda: driver.find_element(By.CSS_SELECTOR, "input[name='username']"), what="the login form")
    user.send_keys(name)
    driver.find_element(By.CSS_SELECTOR, "input[name='password']").send_keys(PASSWORDS[name])
    driver.find_element(By.CSS_SELECTOR, "button[type='submit']").click()
    wait_for(
        lambda: "/auth/login" not in driver.current_url and driver.get_cookie("_token"), what="a signed-in session"
    )


def open_queues(driver, url: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"{url}/plugin/sqlqueue")
    frame = wait_for(lambda: driver.find_element(By.CSS_SELECTOR, "iframe"), what="the Queues page's frame")
    driver.switch_to.frame(frame)
    wait_for(lambda: driver.find_element(By.TAG_NAME, "body").get_attribute("data-loaded"), what="the queues")


def row_text(driver, address: str, column: str) -> str:
    """A cell of the queue's row, read again when a refresh redraws the table while it is read."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    for _ in range(40):
        try:
            for row in driver.find_elements(By.CSS_SELECTOR, "#queues tbody tr"):
                if row.get_attribute("data-queue") == address:
                    return str(row.find_element(By.CSS_SELECTOR, f"td.{column}").text)
            return ""
        except StaleElementReferenceException:
            time.sleep(0.05)
    raise AssertionError(f"the row of {address} was redrawn on every read")


def test_queues_page_shows_depths_and_retries_an_error_message(api_server, browser, pg_uri):
    from selenium.webdriver.common.by import By

    services, schema = api_server
    orders = QueueAddress("orders", schema)
    address = f'orders@"{schema}"'
    ARTIFACTS.mkdir(exist_ok=True)
    with QueueClient.connect(pg_uri) as client:
        client.send(orders, Message(HOSTILE_BODY))  # fails; its body must show as text, never run
        client.send(
            orders, [Message(f"order {n}", {"NServiceBus.EnclosedMessageTypes": "Shop.OrderPlaced"}) for n in range(3)]
        )
        [failing] = client.claim(orders)
        client.fail(orders, failing, ValueError("price missing"))

        login(browser, services.url)
        open_queues(browser, services.url)
        browser.find_element(By.ID, "search").send_keys(schema)
        wait_for(lambda: row_text(browser, address, "waiting") == "3", what="orders waiting 3")
        browser.save_screenshot(str(ARTIFACTS / "queues-page.png"))

        client.send(orders, [Message(f"more {n}") for n in range(4)])
        browser.find_element(By.ID, "refresh").click()
        wait_for(lambda: row_text(browser, address, "waiting") == "7", what="orders waiting 7 after a send")

        error_address = f'error@"{schema}"'
        browser.find_element(By.ID, "search").clear()
        wait_for(
            lambda: (
                error_address
                in [o.get_attribute("value") for o in browser.find_elements(By.CSS_SELECTOR, "#error-queue option")]
            )
        )
        from selenium.webdriver.support.ui import Select

        loaded = browser.find_element(By.TAG_NAME, "body").get_attribute("data-loaded")
        Select(browser.find_element(By.ID, "error-queue")).select_by_value(error_address)
        wait_for(
            lambda: browser.find_element(By.TAG_NAME, "body").get_attribute("data-loaded") != loaded, what="a reload"
        )

        def failed_item():
            return next(
                li
                for li in browser.find_elements(By.CSS_SELECTOR, "#failures li")
                if li.get_attribute("data-id") == str(failing.id)
            )

        def ticked() -> bool:  # the list may be redrawn by a refresh between finding and clicking: try again
            box = failed_item().find_element(By.CSS_SELECTOR, "input.pick")
            if not box.is_selected():
                box.click()
            return box.is_selected() and browser.find_element(By.ID, "retry-selected").is_enabled()

        def shown_as_text() -> bool:
            item = failed_item()
            body = item.find_element(By.CSS_SELECTOR, "pre.body").get_attribute("textContent")
            return "price missing" in item.text and "builtins.ValueError" in item.text and body == HOSTILE_BODY

        wait_for(shown_as_text, what="the failed message, its exception and its body as text")
        wait_for(ticked, what="the failed message selected")
        browser.find_element(By.ID, "retry-selected").click()
        wait_for(
            lambda: "1 of 1 selected message(s) sent back" in browser.find_element(By.ID, "status").text,
            what="the retry",
        )
        wait_for(
            lambda: all(
                li.get_attribute("data-id") != str(failing.id)
                for li in browser.find_elements(By.CSS_SELECTOR, "#failures li")
            ),
            what="the message leaving the error list",
        )
        assert client.depth(QueueAddress("error", schema)) == 0
        assert failing.id in [m.id for m in client.browse(orders, 100)]
        assert browser.execute_script("return document.title") == "Queues"  # the body was text: nothing in it ran

        browser.switch_to.default_content()
        browser.execute_script("window.localStorage.setItem('theme', 'dark')")
        open_queues(browser, services.url)
        assert browser.execute_script("return document.documentElement.dataset.theme") == "dark"
        background = browser.execute_script("return getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(15, 17, 23)"
        browser.find_element(By.ID, "search").send_keys(schema)
        wait_for(lambda: row_text(browser, address, "waiting") == "8", what="orders waiting 8 in the dark theme")
        browser.save_screenshot(str(ARTIFACTS / "queues-page-dark.png"))


def test_the_page_shows_problems_first_and_who_holds_the_horizon(api_server, browser, pg_uri):
    import psycopg
    from selenium.webdriver.common.by import By

    services, schema = api_server
    late = QueueAddress("late", schema)
    with QueueClient.connect(pg_uri) as client, psycopg.connect(pg_uri) as pin:
        client.create_queue(late)
        client.send(late, Message("due long ago"), delay=0.001)
        client.session.connection.execute(f'UPDATE "{schema}"."late.Delayed" SET Due = Due - interval \'10 minutes\'')
        client.send(late, Message("fails"))
        [failing] = client.claim(late)
        client.fail(late, failing, ValueError("handler failed"))  # a failing handler: its error queue is a problem
        pin.execute("SET application_name = 'browser-health-pin'")
        pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        pin.execute("SELECT 1")
        try:
            login(browser, services.url)
            open_queues(browser, services.url)
            browser.find_element(By.ID, "search").send_keys(schema)

            def rows() -> list[tuple[str, bool]]:
                return [
                    (str(r.get_attribute("data-queue")), "problem" in str(r.get_attribute("class")))
                    for r in browser.find_elements(By.CSS_SELECTOR, "#queues tbody tr")
                ]

            wanted = {(f'late@"{schema}"', True), (f'error@"{schema}"', True), (f'orders@"{schema}"', False)}

            def marked() -> list[tuple[str, bool]] | None:
                got = rows()
                return got if set(got) == wanted else None

            shown = wait_for(marked, what="late and error marked")
            assert [problem for _, problem in shown] == [True, True, False]  # the queues with problems first
            assert row_text(browser, f'late@"{schema}"', "due-delayed").startswith("1 (10 min")
            panel = browser.find_element(By.ID, "problems-panel")
            assert panel.is_displayed()
            assert f'late@"{schema}": 1 delayed message(s) due for 10 min' in panel.text
            assert f'error@"{schema}": about 1 failed message(s) wait in this error queue' in panel.text
            wait_for(lambda: "browser-health-pin" in browser.find_element(By.ID, "horizon").text, what="the pin")
            browser.save_screenshot(str(ARTIFACTS / "queues-page-problems.png"))
        finally:
            pin.rollback()
            client.drop_queue(late)
            client.purge(QueueAddress("error", schema))


def post_from_the_page(driver, path: str, body: dict) -> tuple[int, str]:
    """A POST the page's own session sends (Airflow's cookie, the page's origin), as a user could from its console."""
    status, text = driver.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        fetch(arguments[0], {method: "POST", credentials: "same-origin", body: JSON.stringify(arguments[1]),
                             headers: {"Content-Type": "application/json", Accept: "application/json"}})
          .then(async (answer) => done([answer.status, await answer.text()]))
          .catch((error) => done([0, String(error)]));
        """,
        path,
        body,
    )
    return int(status), str(text)


def get_from_the_page(driver, path: str) -> tuple[int, str]:
    status, text = driver.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        fetch(arguments[0], {credentials: "same-origin", headers: {Accept: "application/json"}})
          .then(async (answer) => done([answer.status, await answer.text()]))
          .catch((error) => done([0, String(error)]));
        """,
        path,
    )
    return int(status), str(text)


def test_a_viewer_watches_queues_read_only_and_an_admin_still_acts(api_server, browser, pg_uri):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    services, schema = api_server
    watched = QueueAddress("watched", schema)
    address = f'watched@"{schema}"'
    error_address = f'error@"{schema}"'
    ARTIFACTS.mkdir(exist_ok=True)
    with QueueClient.connect(pg_uri) as client:
        client.create_queue(watched)
        try:
            client.send(watched, Message(HOSTILE_BODY))
            [failing] = client.claim(watched)
            client.fail(watched, failing, ValueError("card number 4111 rejected"))  # an exception message
            client.send(watched, [Message(f"order {n}") for n in range(2)])
            client.send(watched, Message("stale", time_to_be_received=timedelta(milliseconds=1)))
            time.sleep(0.1)

            login(browser, services.url, "viewer")
            open_queues(browser, services.url)
            browser.find_element(By.ID, "search").send_keys(schema)
            wait_for(
                lambda: row_text(browser, address, "expired") == "1" and row_text(browser, address, "waiting") == "3",
                what="watched's figures, to a viewer",
            )

            notice = browser.find_element(By.ID, "access")
            assert notice.is_displayed()
            assert "needs edit access to the connection (PUT on Connections)" in notice.text
            assert "needs read access to the connection (GET on Connections)" in notice.text

            def purge_button():
                row = next(
                    r
                    for r in browser.find_elements(By.CSS_SELECTOR, "#queues tbody tr")
                    if r.get_attribute("data-queue") == address
                )
                return next(b for b in row.find_elements(By.TAG_NAME, "button") if b.text == "Purge expired")

            wait_for(
                lambda: (
                    not purge_button().is_enabled()
                    and "needs edit access to the connection" in str(purge_button().get_attribute("title"))
                ),
                what="the Purge expired button disabled, saying why",
            )

            loaded = browser.find_element(By.TAG_NAME, "body").get_attribute("data-loaded")
            Select(browser.find_element(By.ID, "error-queue")).select_by_value(error_address)
            wait_for(
                lambda: browser.find_element(By.TAG_NAME, "body").get_attribute("data-loaded") != loaded,
                what="a reload",
            )

            def group_row():
                return next(
                    r
                    for r in browser.find_elements(By.CSS_SELECTOR, "#groups tbody tr")
                    if r.get_attribute("data-source") == address
                )

            def counted_read_only() -> bool:  # read in one go: a refresh may redraw the table between reads
                row = group_row()
                buttons = row.find_elements(By.TAG_NAME, "button")  # Show, Retry all of this queue
                return (
                    row.find_element(By.CSS_SELECTOR, "td.num").text == "1"
                    and "builtins.ValueError" in row.text
                    and len(buttons) == 2
                    and not any(b.is_enabled() for b in buttons)
                )

            wait_for(counted_read_only, what="the error count of watched, its actions disabled")
            wait_for(
                lambda: "Messages are not shown" in browser.find_element(By.ID, "failures").text, what="no messages"
            )
            assert not browser.find_element(By.ID, "retry-selected").is_enabled()
            source = browser.page_source
            assert "4111" not in source and "onerror" not in source  # neither exception message nor body
            browser.save_screenshot(str(ARTIFACTS / "queues-page-read-only.png"))

            # Posted anyway, with the viewer's own session: refused, naming the permission; nothing moves.
            status, text = post_from_the_page(
                browser, "api/connections/sqlqueue_default/purge-expired", {"queue": address}
            )
            assert status == 403, text
            assert json.loads(text)["detail"] == (
                "purging expired messages on connection 'sqlqueue_default' needs edit access to the connection "
                "(PUT on Connections); you may only watch its queues"
            )
            status, text = post_from_the_page(
                browser,
                "api/connections/sqlqueue_default/errors/retry",
                {"error_queue": error_address, "source": address},
            )
            assert status == 403 and "retrying failed messages" in json.loads(text)["detail"], text
            status, text = get_from_the_page(
                browser, f"api/connections/sqlqueue_default/errors/messages?error_queue={error_address}"
            )
            assert status == 403 and "needs read access to the connection" in json.loads(text)["detail"], text
            assert client.depth(watched) == 3 and client.depth(QueueAddress("error", schema)) == 1

            # The admin, in the same browser, still acts.
            browser.switch_to.default_content()
            browser.delete_all_cookies()
            login(browser, services.url)
            open_queues(browser, services.url)
            assert not browser.find_element(By.ID, "access").is_displayed()
            browser.find_element(By.ID, "search").send_keys(schema)

            clicks = []

            def purged() -> bool:  # clicked again if a redraw took the button away before the click landed
                if f"1 expired message(s) purged from {address}" in browser.find_element(By.ID, "status").text:
                    return True
                # On a loaded machine the page's next refresh may replace the status line before it is
                # read; the purge then shows as no expired message left after a click.
                if clicks and row_text(browser, address, "expired") == "0":
                    return True
                button = purge_button()
                if button.is_enabled():
                    button.click()
                    clicks.append(time.monotonic())
                return False

            wait_for(purged, what="the admin's purge")
            assert client.depth(watched) == 2  # the expired message, and only it
        finally:
            client.drop_queue(watched)
            client.purge(QueueAddress("error", schema))


def test_a_journey_shows_each_stage_a_trace_passed_as_text(api_server, browser, pg_uri):
    """Followed from a failed message's Journey button, then by the trace id typed in: the rows in order."""
    from selenium.webdriver.common.by import By

    services, schema = api_server
    trace = uuid.uuid4().hex
    # Queues of this test's own: the module's other tests leave messages in its schema's orders,
    # and a claim of one of theirs would be forwarded instead of this test's message.
    orders, billing, audit = (QueueAddress(name, schema) for name in ("trip_orders", "trip_billing", "trip_audit"))
    with QueueClient.connect(pg_uri, error_queue=QueueAddress("error", schema), audit_queue=audit) as client:
        for queue in (orders, billing, audit):
            client.create_queue(queue)
        client.send(orders, Message("order", {"traceparent": f"00-{trace}-00f067aa0ba902b7-01"}))
        [claim] = client.claim(orders, 1)
        result = Message("invoice", {"traceparent": f"00-{trace}-b7ad6b7169203331-01"})
        client.forward({orders: [claim.claim_token]}, {billing: [result]})
        [held] = client.claim(billing, 1)
        client.fail(billing, held, ValueError(HOSTILE_BODY))

        login(browser, services.url)
        open_queues(browser, services.url)
        browser.find_element(By.ID, "journey-id").send_keys(trace)
        browser.find_element(By.ID, "follow").click()

        def stations() -> list[tuple[str, str]]:
            rows = browser.find_elements(By.CSS_SELECTOR, "#journey tbody tr")
            return [(row.get_attribute("data-station"), row.get_attribute("data-id")) for row in rows]

        # The page's journey searches every queue the connection may read: in a shared test database,
        # every other test's schemas too, a few statements each, which a loaded machine makes slow;
        # a table another test holds locked is left out after the journey's lock wait.
        try:
            wait_for(
                lambda: stations() == [("processed", str(claim.id)), ("failed", str(result.id))],
                timeout=120,
                what="the trace's rows",
            )
        except AssertionError as exc:  # what the page said instead (a refusal, an error, other rows)
            said = browser.find_element(By.ID, "status").text, browser.find_element(By.ID, "journey-notes").text
            raise AssertionError(f"{exc}; rows {stations()}, the page said {said}") from None
        failed = browser.find_elements(By.CSS_SELECTOR, "#journey tbody tr")[1]
        assert HOSTILE_BODY in failed.text and f'error@"{schema}"' in failed.text  # the exception, as text
        assert browser.execute_script("return document.title") == "Queues"
        assert f"trace {trace}: 2 row(s)" in browser.find_element(By.ID, "journey-summary").text
        ARTIFACTS.mkdir(exist_ok=True)
        browser.execute_script("document.getElementById('journey-title').scrollIntoView()")
        browser.save_screenshot(str(ARTIFACTS / "queues-journey.png"))

        browser.find_element(By.ID, "journey-id").clear()
        browser.find_element(By.ID, "journey-id").send_keys("not an id")
        browser.find_element(By.ID, "follow").click()
        wait_for(lambda: "is neither a message id" in browser.find_element(By.ID, "status").text, what="the refusal")
