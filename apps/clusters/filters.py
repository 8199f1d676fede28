"""One FilterSet behind both the fleet page and the clusters API."""

from __future__ import annotations

import django_filters
from django import forms
from django.db.models import Q

from apps.clusters.labels import labelled
from apps.clusters.models import Cluster, Reachability
from apps.clusters.validation import parse_label_selector


class LabelSelectorField(forms.CharField):
    """`key=value` or `key`, cleaned to (key, value) or (key, None): a bad key is the field's error."""

    def to_python(self, value):
        text = super().to_python(value)
        return parse_label_selector(text) if text else None


class LabelFilter(django_filters.CharFilter):
    field_class = LabelSelectorField


class ClusterFilter(django_filters.FilterSet):
    q = django_filters.CharFilter(method="filter_q", label="Name or URL contains")
    team = django_filters.CharFilter(field_name="team__slug", label="Team (slug)")
    reachability = django_filters.ChoiceFilter(choices=Reachability.choices)
    label = LabelFilter(method="filter_label", label="Label key=value (or key)")

    class Meta:
        model = Cluster
        fields = ["q", "team", "reachability", "label"]

    def filter_q(self, queryset, name, value):
        return queryset.filter(Q(name__icontains=value) | Q(dashboard_url__icontains=value))

    def filter_label(self, queryset, name, value):
        return labelled(queryset, *value)
