"""An incident's related work reads the same in a page of incidents as on its own."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.clusters.models import ClusterEvent
from apps.incidents.timeline import related_work, related_work_for
from tests.factories import ClusterFactory, IncidentFactory

pytestmark = pytest.mark.django_db


def test_a_page_of_incidents_shows_each_only_the_restarts_around_it():
    cluster = ClusterFactory()
    now = timezone.now()
    old = IncidentFactory(cluster=cluster, title="old", application_name="a", started_at=now - timedelta(days=3))
    new = IncidentFactory(cluster=cluster, title="new", application_name="b", started_at=now - timedelta(minutes=5))
    restarts = {}
    for name, at in (("days ago", now - timedelta(days=2)), ("just before", now - timedelta(minutes=10))):
        event = ClusterEvent.objects.create(cluster=cluster, kind=ClusterEvent.Kind.CONTROLLER_RESTARTED, message=name)
        ClusterEvent.objects.filter(pk=event.pk).update(created_at=at)
        restarts[name] = event.pk

    page = related_work_for([old, new])

    assert page[new.pk] == related_work(new)
    assert page[old.pk] == related_work(old)
    assert [item["id"] for item in page[new.pk]] == [restarts["just before"]]
    assert [item["id"] for item in page[old.pk]] == [restarts["days ago"], restarts["just before"]]
