"""The push protocol reads, then checks, then pushes, with nothing slow between the check and the
push; the reconciler never pushes over a config a person changed, nor pushes blind."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from apps.changes import protocol
from apps.changes.models import ChangeState
from apps.fleet import client_impact
from tests.unit.changes.test_app_lifecycle import NEW_APP, cluster, operator, ray  # noqa: F401

pytestmark = pytest.mark.django_db


def hand_edit(ray) -> None:
    ray.payload["applications"]["echo2"]["deployed_app_config"]["deployments"][0]["user_config"] = {"greeting": "yo"}


def test_a_config_changed_while_the_opening_reading_waits_is_caught_as_drift(cluster, operator, ray, monkeypatch):
    change = protocol.plan_create_app(operator, cluster, app=NEW_APP, reason="new route")
    protocol.request_apply(operator, change)

    def slow_reading(cluster):
        hand_edit(ray)  # someone fixes echo2 by hand while the metrics endpoint is slow to answer
        return {"why": "the metrics endpoint was slow"}

    monkeypatch.setattr(client_impact, "opening", slow_reading)
    protocol.run(change.pk)

    change.refresh_from_db()
    assert change.state == ChangeState.DRIFTED and not ray.pushes


def died_while_verifying(change) -> None:
    type(change).objects.filter(pk=change.pk).update(
        state=ChangeState.VERIFYING,
        pushed_at=timezone.now(),
        heartbeat_at=timezone.now() - timedelta(hours=1),
    )


def test_the_reconciler_stops_for_a_person_when_the_live_config_is_neither_base_nor_new(cluster, operator, ray):
    change = protocol.plan_create_app(operator, cluster, app=NEW_APP, reason="new route")
    protocol.request_apply(operator, change)
    died_while_verifying(change)
    hand_edit(ray)

    protocol.reconcile(change.pk)

    change.refresh_from_db()
    assert change.state == ChangeState.DRIFTED and not ray.pushes
    assert "neither the base nor this change's config" in change.error and "Nothing was pushed back" in change.error
    assert any('"greeting": "yo"' in line and line.startswith("+") for line in change.drift)


def test_the_reconciler_pushes_nothing_while_the_cluster_cannot_be_read(cluster, operator, ray, use_replay):
    change = protocol.plan_create_app(operator, cluster, app=NEW_APP, reason="new route")
    protocol.request_apply(operator, change)
    died_while_verifying(change)
    use_replay.routes["/api/serve/applications/"] = lambda request: httpx.Response(503, text="restarting")

    protocol.reconcile(change.pk)

    change.refresh_from_db()
    assert change.state == ChangeState.VERIFYING and not ray.pushes
    assert "cannot be read" in change.steps.last().message
    # Its heartbeat was taken: the next reconcile comes after the stale interval, not at once.
    assert protocol.stale_changes() == []
