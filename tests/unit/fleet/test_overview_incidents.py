"""The fleet page: a reachable cluster with an open critical incident says so on its row."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.factories import ClusterFactory, IncidentFactory

pytestmark = pytest.mark.django_db


def test_a_cluster_row_shows_its_open_incidents_worst_first(client, people, team):
    cluster = ClusterFactory(team=team, name="prod")
    seen = (("warning", "open"), ("critical", "open"), ("critical", "acknowledged"), ("major", "resolved"))
    for n, (severity, status) in enumerate(seen):
        IncidentFactory(cluster=cluster, severity=severity, status=status, deployment_name=f"D{n}")
    client.force_login(people["viewer"])
    page = client.get(reverse("fleet:overview")).content.decode()
    critical, warning = page.index("2 open critical"), page.index("1 open warning")
    assert critical < warning and "open major" not in page
