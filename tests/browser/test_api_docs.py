"""The API documentation renders under the content security policy (the page fixture fails a
test on any CSP violation)."""

from __future__ import annotations

import pytest

from tests.browser.pages import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize(("docs", "path"), [("/api/docs/", "/api/v2/wizards/"), ("/api/v1/docs/", "/api/v1/wizards/")])
def test_swagger_ui_renders_the_schema(page, live_server, people, docs, path):
    log_in(page, live_server, "viewer", docs)
    page.wait_for_selector(f"text={path}")
    assert page.locator(".swagger-ui").count() == 1
