"""JSON columns read by orjson answer what Django's JSONField answers."""

from __future__ import annotations

import json

import pytest
from django.db import models

from apps.core.fields import JSONField
from apps.incidents.models import Incident
from tests.factories import ClusterFactory, IncidentFactory

pytestmark = pytest.mark.django_db


def test_a_stored_value_reads_back_as_stored():
    evidence = {"p99_ms": 2400.5, "limit": 750, "nested": [{"a": None, "ok": True}], "ünï": "✓", "huge": 2**70}
    cluster = ClusterFactory()
    incident = IncidentFactory(cluster=cluster, evidence=evidence)
    assert Incident.objects.get(pk=incident.pk).evidence == evidence
    assert list(Incident.objects.filter(pk=incident.pk).values_list("evidence__limit", flat=True)) == [750]


@pytest.mark.parametrize(
    "raw",
    [
        '{"a": [1, 2.5, "x"]}',
        "NaN",
        '{"n": NaN}',
        "12345678901234567890123",
        '{"id": "abc", "n": -9223372036854775809}',
        '{"ünï": "✓", "n": [18446744073709551616]}',
        '{"n": 1844674407370955161, "m": 12345678901234567.5}',
        "not json",
    ],
)
def test_each_text_decodes_as_django_decodes_it(raw):
    ours, django = JSONField(), models.JSONField()
    assert json.dumps(ours.from_db_value(raw, None, None)) == json.dumps(django.from_db_value(raw, None, None))


def test_a_custom_decoder_is_used():
    class Tagged(json.JSONDecoder):
        def __init__(self, **kwargs):
            super().__init__(object_hook=lambda obj: {**obj, "decoded": True}, **kwargs)

    assert JSONField(decoder=Tagged).from_db_value('{"a": 1}', None, None) == {"a": 1, "decoded": True}


def test_migrations_see_djangos_field():
    assert JSONField().deconstruct()[1] == "django.db.models.JSONField"
