"""The API's filter backend leaves a list alone when the request names none of its filters, and
filters exactly as django-filter does otherwise."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils import timezone
from django_filters.rest_framework import DjangoFilterBackend

from apps.accounts.filters import FilterBackend
from apps.fleet.models import Application
from tests.unit.fleet.test_query_counts import add_rows

pytestmark = pytest.mark.django_db


def test_a_list_without_filter_parameters_skips_the_filter_set(api_as, people, team, monkeypatch):
    add_rows(team, people["admin"], 2)
    built = []
    original = DjangoFilterBackend.filter_queryset

    def counting(self, request, queryset, view):
        built.append(view.basename)
        return original(self, request, queryset, view)

    monkeypatch.setattr(DjangoFilterBackend, "filter_queryset", counting)
    client = api_as("admin")
    assert client.get(reverse("incident-list")).status_code == 200
    assert built == []
    assert len(client.get(reverse("incident-list") + "?status=open").json()["results"]) == 2
    assert built == ["incident"]


def test_removed_rows_stay_hidden_without_the_filter_set(api_as, people, team, monkeypatch):
    add_rows(team, people["admin"], 2)
    original = DjangoFilterBackend.filter_queryset
    built = []
    monkeypatch.setattr(
        DjangoFilterBackend, "filter_queryset", lambda *args: built.append(args[-1].basename) or original(*args)
    )
    gone = Application.objects.first()
    Application.objects.filter(pk=gone.pk).update(removed_at=timezone.now())
    client = api_as("admin")
    listed = {row["id"] for row in client.get(reverse("application-list")).json()["results"]}
    assert gone.pk not in listed and listed
    assert built == []
    everything = client.get(reverse("application-list") + "?include_removed=true").json()["results"]
    assert gone.pk in {row["id"] for row in everything}
    assert built == ["application"]


def test_a_range_parameter_counts_as_naming_its_filter(rf):
    from rest_framework.request import Request

    from apps.accounts import filters
    from apps.incidents.filters import IncidentFilter

    assert filters._filters_anything(IncidentFilter, Request(rf.get("/", {"since_min": "x"})))
    assert not filters._filters_anything(IncidentFilter, Request(rf.get("/", {"page": "2", "view": "summary"})))
    assert isinstance(FilterBackend(), DjangoFilterBackend)
