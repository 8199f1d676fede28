"""What the browser tests share: signing in as one of the test people (password "pw"), and waiting
for a page's script to get somewhere."""

from __future__ import annotations

import time

from playwright.sync_api import Error as PlaywrightError


def log_in(page, live_server, who: str, next_path: str = "") -> None:
    page.goto(f"{live_server.url}/accounts/login/" + (f"?next={next_path}" if next_path else ""))
    page.fill("#id_username", who)
    page.fill("#id_password", "pw")
    page.click("button[type=submit]")


def wait_until(page, expression: str, timeout_s: float = 15.0) -> None:
    """Poll a JavaScript expression from Python until it is truthy. Playwright's wait_for_function
    polls with a predicate compiled in the page, which the pages' CSP (no 'unsafe-eval') refuses
    whenever the first check fails; page.evaluate goes through the debugger protocol instead. A
    navigation in progress is waited out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if page.evaluate(expression):
                return
        except PlaywrightError as exc:
            if "navigat" not in str(exc) and "Execution context" not in str(exc):
                raise
        if time.monotonic() > deadline:
            raise AssertionError(f"{expression} was still false after {timeout_s:.0f} s on {page.url}")
        time.sleep(0.1)
