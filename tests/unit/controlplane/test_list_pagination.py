"""API lists: page numbers with a capped count, keyset pages with `?cursor=`, and no paging of an
unordered list."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from apps.accounts.models import AuditEvent
from controlplane.api import pagination
from tests.factories import ClusterFactory, IncidentFactory

pytestmark = pytest.mark.django_db
URL = "/api/v1/audit-events/"


@pytest.fixture
def seven_events(team, people, monkeypatch):
    """Seven audit events in pages of 2, counted up to 3."""
    monkeypatch.setattr(pagination, "COUNT_CAP", 3)
    monkeypatch.setattr(pagination.CappedCountPagination, "page_size", 2)
    for n in range(7):
        AuditEvent.objects.create(actor=people["admin"], actor_name="admin", action=f"test.{n}", team=team)


def test_the_count_stops_at_the_cap_and_says_so(seven_events, api_as):
    body = api_as("admin").get(URL).json()
    assert (body["count"], body["count_capped"], len(body["results"])) == (3, True, 2)
    assert body["next"].endswith("?page=2")


def test_a_page_past_the_cap_is_counted_to_its_end_and_the_last_is_exact(seven_events, api_as):
    client = api_as("admin")
    third = client.get(f"{URL}?page=3").json()
    assert (third["count"], third["count_capped"], len(third["results"])) == (6, True, 2) and third["next"]
    fourth = client.get(f"{URL}?page=4").json()
    assert (fourth["count"], fourth["count_capped"], len(fourth["results"]), fourth["next"]) == (7, False, 1, None)
    last = client.get(f"{URL}?page=last").json()
    assert (last["count"], last["count_capped"], last["results"]) == (7, False, fourth["results"])
    assert client.get(f"{URL}?page=5").status_code == 404
    assert client.get(f"{URL}?page={10**25}").status_code == 404


def test_a_short_list_is_counted_exactly(team, people, api_as):
    AuditEvent.objects.create(actor=people["admin"], actor_name="admin", action="test.one", team=team)
    body = api_as("admin").get(URL).json()
    assert (body["count"], body["count_capped"], body["next"]) == (1, False, None)


def test_keyset_pages_walk_the_list_in_its_order_without_overlap(seven_events, api_as):
    client = api_as("admin")
    in_order = [row["id"] for page in (1, 2, 3, 4) for row in client.get(f"{URL}?page={page}").json()["results"]]
    walked, url = [], f"{URL}?cursor="
    while url:
        body = client.get(url).json()
        assert set(body) == {"next", "previous", "results"}
        walked += [row["id"] for row in body["results"]]
        url = body["next"]
    assert walked == in_order and len(walked) == 7


def test_incidents_page_by_keyset_newest_signal_first(team, api_as):
    cluster = ClusterFactory(team=team)
    now = timezone.now()
    made = [
        IncidentFactory(
            cluster=cluster,
            application_name=f"app{n}",
            title=f"OOM {n}",
            started_at=now,
            last_signal_at=now.replace(second=n),
        )
        for n in range(3)
    ]
    body = api_as("viewer").get("/api/v1/incidents/?cursor=").json()
    assert [row["id"] for row in body["results"]] == [incident.pk for incident in reversed(made)]


def test_an_unordered_list_is_refused():
    with pytest.raises(ImproperlyConfigured):
        pagination.require_ordered(AuditEvent.objects.order_by())
    pagination.require_ordered(AuditEvent.objects.all())
