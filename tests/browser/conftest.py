"""The browser: Playwright drives Debian's Chromium (scripts/install-browser.sh installs it)."""

from __future__ import annotations

import os

import pytest
from django.db import connections

# Playwright's sync API runs an event loop in this thread; the ORM calls here happen between
# browser steps, never concurrently with them.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = os.environ.get("FLEETDECK_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture
def page(live_server):
    # Depending on live_server makes the browser close first, so no htmx poll is in flight (and
    # holding a database connection) while the server stops.
    from playwright.sync_api import sync_playwright

    assert os.path.exists(CHROMIUM), f"{CHROMIUM} is missing: run scripts/install-browser.sh"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        # Every browser test also proves the pages work under the content security policy.
        blocked: list[str] = []
        page.on(
            "console",
            lambda message: blocked.append(message.text) if "Content Security Policy" in message.text else None,
        )
        yield page
        browser.close()
        assert not blocked, f"the content security policy blocked: {blocked}"
        # ORM calls made while Playwright's loop runs get connections stored in that loop's
        # context; close them here, or PostgreSQL cannot drop the test database afterwards.
        connections.close_all()
