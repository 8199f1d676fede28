"""Forms read as sentences: labels in words with their units, help under each number, and every
checkbox inside its own label, before the words it ticks."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from apps.fleet import sync
from apps.fleet.models import Deployment
from apps.kubernetes.forms import ConnectionForm
from apps.maintenance.forms import ProfileForm, ScheduleForm
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def deployment(team, use_replay):
    cluster = ClusterFactory(name="vision-prod", team=team)
    sync.sync_cluster(cluster.pk)
    return Deployment.objects.select_related("application").filter(application__cluster=cluster).first()


def forms_of(deployment, people):
    application = deployment.application
    return [ScheduleForm(application=application), ProfileForm(), ConnectionForm(user=people["admin"])]


def test_labels_say_what_a_field_is_with_its_unit_in_words(deployment, people):
    for form in forms_of(deployment, people):
        for name, field in form.fields.items():
            label = str(field.label or "")
            # Django's default label of every_hours or timeout_s: "Every hours", "Timeout s".
            assert not re.search(r"(^Every hours$|\b(s|ms|hours)$)", label), f"{type(form).__name__}.{name}: {label!r}"


def test_every_number_and_time_field_explains_what_it_takes(deployment, people):
    for form in forms_of(deployment, people)[:2]:
        for name in (
            "every_hours",
            "timeout_s",
            "window_start_hour",
            "window_end_hour",
            "timezone",
            "requests",
            "concurrency",
        ):
            if name in form.fields:
                assert form.fields[name].help_text, f"{type(form).__name__}.{name} has no help text"


def checkbox_labels(html: str) -> list[str]:
    return re.findall(r'<div class="field check">\s*<label><input type="checkbox" name="(\w+)"', html)


def test_the_recycle_and_warmup_forms_put_each_checkbox_inside_its_label(client, people, deployment):
    client.force_login(people["operator"])
    schedule = client.get(reverse("maintenance:schedule", args=[deployment.pk])).content.decode()
    assert checkbox_labels(schedule) == ["enabled"]
    assert '<fieldset class="field choices">' in schedule and "<legend>Window days</legend>" in schedule
    warmups = client.get(reverse("maintenance:warmups", args=[deployment.application.pk])).content.decode()
    assert checkbox_labels(warmups) == ["enabled"]
    assert "Timeout per request (seconds)" in warmups and "Timeout s" not in warmups


def test_the_kubernetes_connection_form_puts_each_checkbox_inside_its_label(client, people):
    client.force_login(people["root"])
    html = client.get(reverse("kubernetes:connection_create")).content.decode()
    assert checkbox_labels(html) == ["in_cluster", "read_only"]
