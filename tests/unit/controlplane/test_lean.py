"""Lean instances are the instances Django builds: the same values, the same related rows, the
same deferred loading, and Django's own constructor wherever the shortcut would skip something."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db.models import Count, Prefetch
from django.db.models.signals import post_init

from apps.changes.models import Change, ChangeStep
from apps.clusters.models import Cluster
from apps.incidents.models import Incident
from controlplane.api.lean import LeanModelIterable, lean
from tests.factories import ChangeFactory, ClusterFactory, IncidentFactory

pytestmark = pytest.mark.django_db


def fields_of(obj) -> dict:
    return {key: value for key, value in vars(obj).items() if key != "_state"}


def test_rows_carry_the_values_django_loads():
    cluster = ClusterFactory(labels={"env": "prod"})
    IncidentFactory(cluster=cluster)
    IncidentFactory(cluster=cluster, application_name="other")
    django = list(Incident.objects.select_related("cluster__team").order_by("pk"))
    ours = list(lean(Incident.objects.select_related("cluster__team").order_by("pk")))
    assert [fields_of(obj) for obj in ours] == [fields_of(obj) for obj in django]
    assert [fields_of(obj.cluster.team) for obj in ours] == [fields_of(obj.cluster.team) for obj in django]
    for obj in ours:
        assert obj._state.db == "default" and obj._state.adding is False
        assert obj == Incident.objects.get(pk=obj.pk)  # equality and hashing need the pk and the class


def test_related_rows_are_cached_and_a_missing_one_is_none(django_assert_num_queries):
    user = get_user_model().objects.create_user(username="alice")
    ChangeFactory(created_by=user)
    ChangeFactory(created_by=None)
    with django_assert_num_queries(1):
        changes = list(lean(Change.objects.select_related("cluster", "created_by").order_by("pk")))
        assert [change.created_by.username if change.created_by else None for change in changes] == ["alice", None]
        assert changes[0].cluster.name


def test_a_deferred_field_still_loads_when_read(django_assert_num_queries):
    cluster = ClusterFactory(labels={"env": "prod"})
    with django_assert_num_queries(1):
        (row,) = lean(Cluster.objects.filter(pk=cluster.pk).only("name", "team__slug").select_related("team"))
        assert row.name == cluster.name and row.team.slug == cluster.team.slug
    assert row.get_deferred_fields() >= {"labels", "dashboard_url"}
    with django_assert_num_queries(1):
        assert row.labels == {"env": "prod"}


def test_annotations_and_prefetches_arrive_as_with_django():
    change = ChangeFactory()
    ChangeStep.objects.create(change=change, state="checking", message="checking")
    (row,) = lean(
        Change.objects.annotate(step_count=Count("steps")).prefetch_related(
            Prefetch("steps", queryset=lean(ChangeStep.objects.order_by("pk")), to_attr="step_rows")
        )
    )
    assert row.step_count == 1
    assert [step.message for step in row.step_rows] == ["checking"]
    assert row.step_rows[0].change_id == change.pk


def test_a_listened_to_model_is_built_by_django():
    cluster = ClusterFactory()
    seen = []

    def receiver(sender, instance, **kwargs):
        seen.append(instance.pk)

    post_init.connect(receiver, sender=Cluster)
    try:
        (row,) = lean(Cluster.objects.filter(pk=cluster.pk))
    finally:
        post_init.disconnect(receiver, sender=Cluster)
    assert seen == [cluster.pk] and row.name == cluster.name


def test_values_querysets_and_related_managers_are_left_to_django():
    cluster = ClusterFactory()
    IncidentFactory(cluster=cluster)
    assert lean(Cluster.objects.values("name"))._iterable_class is not LeanModelIterable
    (incident,) = lean(cluster.incidents.all())
    assert incident.cluster is cluster  # the manager's parent object, as Django sets it
