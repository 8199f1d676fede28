"""List rows written by `controlplane.api.rows.FastRows` are what DRF's field walk writes: every list
endpoint under /api/v1/ and /api/v2/, its other forms and the detail of each row answer the same
JSON both ways."""

from __future__ import annotations

import pytest
from django.urls import reverse

from controlplane.api import rows
from controlplane.urls import router
from tests.unit.fleet.test_query_counts import LIST_FORMS, V2_FORMS, add_rows

pytestmark = pytest.mark.django_db

URLS = [
    *((f"{version}{basename}", "") for version in ("", "v2:") for _, _, basename in sorted(router.registry)),
    *LIST_FORMS,
    *((f"v2:{basename}", query) for basename, query in V2_FORMS),
]


def both_ways(client, url: str, monkeypatch) -> tuple:
    fast = client.get(url)
    assert fast.status_code == 200, (url, fast.status_code)
    monkeypatch.setattr(rows, "DRF_WALK", True)
    try:
        walked = client.get(url)
    finally:
        monkeypatch.setattr(rows, "DRF_WALK", False)
    return fast.json(), walked.json()


@pytest.mark.parametrize(("basename", "query"), URLS)
def test_fast_rows_answer_what_drf_writes(api_as, people, team, basename, query, monkeypatch):
    add_rows(team, people["admin"], 3)
    client = api_as("admin")
    fast, walked = both_ways(client, reverse(f"{basename}-list") + query, monkeypatch)
    assert fast == walked
    results = fast["results"] if isinstance(fast, dict) and "results" in fast else fast
    for row in results[:2]:
        if isinstance(row, dict) and "id" in row:
            detail, walked_detail = both_ways(client, reverse(f"{basename}-detail", args=[row["id"]]), monkeypatch)
            assert detail == walked_detail


def test_a_field_type_without_a_fast_row_is_refused():
    from rest_framework import serializers

    from apps.fleet.models import Application

    class Linked(rows.FastRows, serializers.ModelSerializer):
        cluster = serializers.HyperlinkedRelatedField(view_name="cluster-detail", read_only=True)

        class Meta:
            model = Application
            fields = ["id", "cluster"]

    with pytest.raises(TypeError, match="HyperlinkedRelatedField"):
        Linked().to_representation(Application(pk=1, cluster_id=1))


@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin", "America/St_Johns"])
def test_datetimes_are_written_as_drf_writes_them_in_the_current_zone(zone):
    """The datetime writer looks the time zone up once per serializer: a page, nested rows
    included, reads as DRF's per-value lookup does whatever zone is active."""
    from datetime import UTC, datetime, timedelta
    from zoneinfo import ZoneInfo

    from django.utils import timezone
    from rest_framework import serializers

    from apps.incidents.models import Incident

    class Rows(rows.FastRows, serializers.ModelSerializer):
        class Meta:
            model = Incident
            fields = ["id", "started_at", "last_signal_at", "resolved_at"]

    at = datetime(2026, 3, 29, 0, 59, 59, 123456, tzinfo=UTC)
    incidents = [
        Incident(pk=n, started_at=at + timedelta(hours=n), last_signal_at=at, resolved_at=None if n else at)
        for n in range(3)
    ]
    with timezone.override(ZoneInfo(zone)):
        fast = Rows(incidents, many=True).data
        walked = [serializers.ModelSerializer.to_representation(Rows(), incident) for incident in incidents]
    assert fast == walked
    assert fast[0]["resolved_at"] is not None and fast[1]["resolved_at"] is None
