"""One FilterSet behind both the fleet page and the clusters API."""

from __future__ import annotations

import django_filters
from django.db.models import Q

from apps.clusters.models import Cluster, Reachability


class ClusterFilter(django_filters.FilterSet):
    q = django_filters.CharFilter(method="filter_q", label="Name or URL contains")
    team = django_filters.CharFilter(field_name="team__slug", label="Team (slug)")
    reachability = django_filters.ChoiceFilter(choices=Reachability.choices)
    label = django_filters.CharFilter(method="filter_label", label="Label key=value (or key)")

    class Meta:
        model = Cluster
        fields = ["q", "team", "reachability", "label"]

    def filter_q(self, queryset, name, value):
        return queryset.filter(Q(name__icontains=value) | Q(dashboard_url__icontains=value))

    def filter_label(self, queryset, name, value):
        # JSON containment works on PostgreSQL and on SQLite through Django's JSON1 support, but
        # SQLite lacks `contains` on JSONField; key lookups work on both.
        key, _, wanted = value.partition("=")
        key = key.strip()
        if not key:
            return queryset
        if not _:
            return queryset.filter(labels__has_key=key)
        return queryset.filter(**{f"labels__{key}": wanted.strip()})
