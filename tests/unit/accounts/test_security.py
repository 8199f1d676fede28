"""Web-facing protections: the content security policy, security headers, login lockout and CSRF
on htmx requests. Each test fails when its protection is switched off."""

from __future__ import annotations

import json
import re

import pytest
from django.conf import settings
from django.test import Client
from django.urls import reverse

from apps.accounts.models import AuditEvent
from apps.fleet.models import Application, Deployment
from tests.factories import ClusterFactory, IncidentFactory

pytestmark = pytest.mark.django_db


def test_pages_carry_a_strict_script_policy(client, people):
    client.force_login(people["viewer"])
    response = client.get(reverse("fleet:overview"))
    policy = response["Content-Security-Policy"]
    directives = dict(part.strip().split(" ", 1) for part in policy.split(";") if part.strip())
    assert directives["script-src"].split()[0] == "'self'"
    assert "'unsafe-inline'" not in directives["script-src"] and "'unsafe-eval'" not in directives["script-src"]
    assert directives["frame-ancestors"] == "'none'" and directives["object-src"] == "'none'"


def test_htmx_gives_the_pages_nonce_to_no_script_in_a_swapped_fragment(client, people):
    client.force_login(people["viewer"])
    page = client.get(reverse("fleet:overview")).content.decode()
    config = json.loads(re.search(r"<meta name=\"htmx-config\" content='([^']*)'>", page).group(1))
    assert "inlineScriptNonce" not in config and config["includeIndicatorStyles"] is False


def fragment_templates() -> dict[str, str]:
    """The templates htmx swaps in: views answer htmx requests with a template from a partials/
    folder (`"fleet/partials/…" if request.htmx else …`), and with whatever that one includes."""
    roots = [settings.BASE_DIR / "templates", *settings.BASE_DIR.glob("apps/*/templates")]
    sources = {path.relative_to(root).as_posix(): path.read_text() for root in roots for path in root.rglob("*.html")}
    pending = [name for name in sources if "partials/" in name]
    fragments: dict[str, str] = {}
    while pending:
        name = pending.pop()
        if name in sources and name not in fragments:
            fragments[name] = sources[name]
            pending += re.findall(r"{%\s*include\s+\"([^\"]+)\"", sources[name])
    return fragments


def test_no_template_htmx_swaps_in_carries_a_script_element():
    fragments = fragment_templates()
    assert {"calibration/partials/card.html", "fleet/partials/deployment_live.html", "partials/diff.html"} <= set(
        fragments
    )
    assert [name for name, source in fragments.items() if "<script" in source.lower()] == []


def test_the_deployment_page_loads_the_script_that_draws_its_calibration_card(client, people, team):
    cluster = ClusterFactory(name="c", team=team)
    application = Application.objects.create(cluster=cluster, name="demo")
    deployment = Deployment.objects.create(application=application, name="Model")
    client.force_login(people["viewer"])
    page = client.get(reverse("fleet:deployment", args=[deployment.pk])).content.decode()
    assert 'id="calibration-card"' in page and "js/calibration_chart.js" in page


def test_every_inline_script_of_a_chart_page_has_the_nonce(client, people, team):
    from django.utils import timezone

    cluster = ClusterFactory(name="c", team=team)
    now = timezone.now()
    incident = IncidentFactory(
        kind="latency_spike",
        cluster=cluster,
        application_name="a",
        deployment_name="d",
        title="slow",
        started_at=now,
        evidence={"series": [{"t": 1, "p50": 10, "p99": 50, "ongoing": 1, "queued": 0, "rps": 1}]},
    )
    client.force_login(people["viewer"])
    response = client.get(reverse("incidents:detail", args=[incident.pk]))
    nonce = re.search(r"'nonce-([^']+)'", response["Content-Security-Policy"])
    page = response.content.decode()
    inline = re.findall(r"<script(?![^>]*\bsrc=)([^>]*)>", page)
    executable = [attrs for attrs in inline if "application/json" not in attrs]
    # The charts come from a script file of this site; anything inline left must carry the nonce.
    assert "js/incident_charts.js" in page
    assert all(nonce and f'nonce="{nonce.group(1)}"' in attrs for attrs in executable)


def test_security_headers_are_set(client):
    response = client.get(reverse("login"))
    assert response["X-Frame-Options"] == "DENY"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Referrer-Policy"] == "same-origin"
    assert response["Cross-Origin-Opener-Policy"] == "same-origin"


def test_repeated_wrong_passwords_lock_the_login_for_that_user_and_address(client, people, settings):
    settings.AXES_FAILURE_LIMIT = 3
    for _ in range(2):
        assert client.post(reverse("login"), {"username": "operator", "password": "wrong"}).status_code == 200
    assert client.post(reverse("login"), {"username": "operator", "password": "wrong"}).status_code == 429
    # Locked: even the right password is refused until the cool-off ends.
    locked = client.post(reverse("login"), {"username": "operator", "password": "pw"})
    assert locked.status_code == 429 and b"Too many failed logins" in locked.content
    assert AuditEvent.objects.filter(action="auth.login_failed").count() >= 3
    # Another account from the same address is not punished for it.
    other = client.post(reverse("login"), {"username": "viewer", "password": "pw"})
    assert other.status_code == 302


def test_a_forged_forwarded_for_header_moves_neither_the_audit_nor_the_lockout(
    client, people, settings, api_as, use_replay
):
    settings.AXES_FAILURE_LIMIT = 2
    # Not behind a proxy: X-Forwarded-For is the client's own claim.
    api_as("admin").post(
        "/api/v1/clusters/",
        {"name": "a", "team": "vision", "dashboard_url": "http://ray.test:8265"},
        format="json",
        HTTP_X_FORWARDED_FOR="203.0.113.9",
    )
    assert AuditEvent.objects.get(action="cluster.register").source_ip == "127.0.0.1"
    for forged in ("203.0.113.1", "203.0.113.2", "203.0.113.3"):
        client.post(reverse("login"), {"username": "operator", "password": "wrong"}, HTTP_X_FORWARDED_FOR=forged)
    assert (
        client.post(
            reverse("login"), {"username": "operator", "password": "pw"}, HTTP_X_FORWARDED_FOR="203.0.113.4"
        ).status_code
        == 429
    )


def test_behind_the_proxy_the_address_is_the_one_it_appended(client, people, settings):
    settings.FLEETDECK_PROXY_COUNT = 1
    settings.AXES_FAILURE_LIMIT = 2
    for forged in ("203.0.113.1", "203.0.113.2"):
        client.post(
            reverse("login"),
            {"username": "operator", "password": "wrong"},
            HTTP_X_FORWARDED_FOR=f"{forged}, 198.51.100.7",
        )
    attacker = client.post(
        reverse("login"), {"username": "operator", "password": "pw"}, HTTP_X_FORWARDED_FOR="203.0.113.3, 198.51.100.7"
    )
    assert attacker.status_code == 429
    assert AuditEvent.objects.filter(action="auth.login_failed").first().source_ip == "198.51.100.7"
    # Everyone comes through the proxy's one address; the user's own login elsewhere still works.
    assert (
        Client()
        .post(reverse("login"), {"username": "operator", "password": "pw"}, HTTP_X_FORWARDED_FOR="198.51.100.8")
        .status_code
        == 302
    )


def test_an_htmx_post_without_the_csrf_token_is_refused(people, team, use_replay):
    cluster = ClusterFactory(name="c", team=team)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(people["operator"])
    page = browser.get(reverse("fleet:cluster", args=[cluster.pk]))
    token = re.search(r'"X-CSRFToken": "([^"]+)"', page.content.decode()).group(1)
    url = reverse("clusters:sync", args=[cluster.pk])
    assert browser.post(url, HTTP_HX_REQUEST="true").status_code == 403
    assert browser.post(url, HTTP_HX_REQUEST="true", HTTP_X_CSRFTOKEN=token).status_code in (200, 202, 302)


def test_the_api_throttles_a_user_past_the_rate(api_as, monkeypatch):
    from django.core.cache import cache
    from rest_framework.throttling import UserRateThrottle

    cache.clear()
    monkeypatch.setattr(UserRateThrottle, "THROTTLE_RATES", {"user": "3/min", "anon": "3/min"})
    client = api_as("viewer")
    answers = [client.get("/api/v1/clusters/").status_code for _ in range(4)]
    assert answers == [200, 200, 200, 429]
