from datetime import UTC

import django_filters
from django import forms
from django_filters.fields import IsoDateTimeField

from apps.accounts.filters import IdFilter
from apps.incidents.models import Incident


class UtcDateTimeField(IsoDateTimeField):
    """ISO 8601 allows UTC offsets PostgreSQL refuses (beyond ±15:59): compare in UTC."""

    def to_python(self, value):
        value = super().to_python(value)
        try:
            return value.astimezone(UTC) if value is not None else None
        except OverflowError as exc:
            raise forms.ValidationError("Enter a date and time between the years 1 and 9999 in UTC.") from exc


class UtcDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = UtcDateTimeField


class IncidentFilter(django_filters.FilterSet):
    cluster = IdFilter(field_name="cluster_id")
    application = django_filters.CharFilter(field_name="application_name")
    deployment = django_filters.CharFilter(field_name="deployment_name")
    since = UtcDateTimeFilter(field_name="last_signal_at", lookup_expr="gte")
    until = UtcDateTimeFilter(field_name="started_at", lookup_expr="lte")

    class Meta:
        model = Incident
        fields = ["cluster", "application", "deployment", "kind", "status", "severity", "since", "until"]
