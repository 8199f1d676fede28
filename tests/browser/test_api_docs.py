"""The API documentation renders under the content security policy (the page fixture fails a
test on any CSP violation)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_swagger_ui_renders_the_schema(page, live_server, people):
    page.goto(f"{live_server.url}/accounts/login/?next=/api/docs/")
    page.fill("#id_username", "viewer")
    page.fill("#id_password", "pw")
    page.click("button[type=submit]")
    page.wait_for_selector("text=/api/v1/wizards/")
    assert page.locator(".swagger-ui").count() == 1
