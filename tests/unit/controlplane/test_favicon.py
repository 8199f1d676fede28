"""Every page links Fleetdeck's icon, so no browser asks for a missing /favicon.ico."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

pytestmark = pytest.mark.django_db


def icon_href(html: str) -> str:
    match = re.search(r'<link rel="icon" href="([^"]+)" type="image/svg\+xml">', html)
    assert match, "no icon linked"
    return match.group(1)


def test_the_login_page_links_an_svg_icon_that_is_served(client):
    href = icon_href(client.get(reverse("login")).content.decode())
    response = client.get(href)
    assert response.status_code == 200
    assert b"".join(response.streaming_content if response.streaming else [response.content]).startswith(b"<svg")


def test_the_admin_links_the_same_icon_as_the_app(client, people):
    client.force_login(people["root"])
    fleet = client.get(reverse("fleet:overview")).content.decode()
    assert icon_href(client.get(reverse("admin:index")).content.decode()) == icon_href(fleet)
