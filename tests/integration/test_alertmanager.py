"""Incidents sent to a real Alertmanager: Debian's prometheus-alertmanager on loopback, with its own
config, data dir and port, stopped by its pid. The alert appears with the labels teams route on,
stays while the incident is open and re-sent, and resolves when the incident does; an Alertmanager
that refuses the body gets the delivery marked failed with its status."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from apps.accounts.audit import Actor
from apps.demo.local_ray import free_port
from apps.incidents import actions, services, webhooks
from apps.incidents.models import Incident, Webhook, WebhookDelivery
from tests.unit.incidents.test_webhooks import oom_cluster  # noqa: F401  (fixture)

pytestmark = pytest.mark.django_db
ALERTMANAGER = os.environ.get("FLEETDECK_ALERTMANAGER", "/usr/bin/prometheus-alertmanager")
CONFIG = """\
route:
  receiver: nobody
receivers:
  - name: nobody
"""


@pytest.fixture
def alertmanager():
    if not os.access(ALERTMANAGER, os.X_OK):
        raise RuntimeError(f"No Alertmanager at {ALERTMANAGER}: run scripts/install-monitoring.sh (make test runs it).")
    folder = Path(tempfile.mkdtemp(prefix="fdam-", dir="/tmp"))
    (folder / "alertmanager.yml").write_text(CONFIG)
    port = free_port()
    with open(folder / "alertmanager.log", "ab") as log:
        process = subprocess.Popen(
            [
                ALERTMANAGER,
                f"--config.file={folder / 'alertmanager.yml'}",
                f"--storage.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--cluster.listen-address=",  # no gossip port: a single instance
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, (folder / "alertmanager.log").read_text()
            try:
                if httpx.get(f"{url}/-/ready", timeout=2, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "Alertmanager never became ready"
            time.sleep(0.2)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)


def alerts(url: str, **params) -> list[dict]:
    return httpx.get(f"{url}/api/v2/alerts", params=params, timeout=5, trust_env=False).json()


def deliver_all(incident: Incident) -> list[WebhookDelivery]:
    for delivery in WebhookDelivery.objects.filter(incident=incident, state="pending").order_by("pk"):
        webhooks.deliver(delivery.pk)
    return list(WebhookDelivery.objects.filter(incident=incident).order_by("pk"))


def test_an_incident_fires_in_alertmanager_and_resolves_with_it(alertmanager, oom_cluster, team, people):
    webhooks.save_webhook(Actor(user=people["admin"]), team=team, url=alertmanager, kind=Webhook.Kind.ALERTMANAGER)
    [incident_id] = services.detect(oom_cluster.pk)
    incident = Incident.objects.get(pk=incident_id)
    [opened] = deliver_all(incident)
    assert opened.state == "delivered" and opened.last_status == 200, opened.last_error

    [firing] = alerts(alertmanager, active="true")
    assert firing["status"]["state"] == "active"
    assert firing["labels"]["alertname"] == "FleetdeckIncident" and firing["labels"]["team"] == team.slug
    assert (firing["labels"]["cluster"], firing["labels"]["deployment"]) == ("gpu-prod", "Model")
    assert firing["labels"]["cause"] == "OOM-2" and firing["annotations"]["summary"] == incident.title

    # Re-sent while open: the same alert (same labels), not a second one.
    WebhookDelivery.objects.update(created_at=opened.created_at.replace(year=2000))
    [job] = list(webhooks.alerts_still_open())
    webhooks.deliver(job.args[0])
    assert len(alerts(alertmanager, active="true")) == 1

    actions.set_status(Actor(user=people["operator"]), incident, Incident.Status.RESOLVED)
    *_, resolved = deliver_all(incident)
    assert resolved.event == "resolved" and resolved.state == "delivered", resolved.last_error
    assert alerts(alertmanager, active="true") == []


def test_a_body_alertmanager_refuses_fails_the_delivery_with_its_status(
    alertmanager,
    oom_cluster,
    team,
    people,
    monkeypatch,
):
    from apps.incidents import alert_bodies

    real = alert_bodies.alert
    monkeypatch.setattr(alert_bodies, "alert", lambda *args: {**real(*args), "startsAt": "not a time"})
    webhooks.save_webhook(Actor(user=people["admin"]), team=team, url=alertmanager, kind=Webhook.Kind.ALERTMANAGER)
    [incident_id] = services.detect(oom_cluster.pk)
    [delivery] = deliver_all(Incident.objects.get(pk=incident_id))
    assert delivery.state == "failed" and delivery.last_status == 400, delivery.last_error
    assert alerts(alertmanager) == []
