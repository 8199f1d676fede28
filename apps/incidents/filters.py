import django_filters

from apps.incidents.models import Incident


class IncidentFilter(django_filters.FilterSet):
    cluster = django_filters.NumberFilter(field_name="cluster_id")
    application = django_filters.CharFilter(field_name="application_name")
    deployment = django_filters.CharFilter(field_name="deployment_name")
    since = django_filters.IsoDateTimeFilter(field_name="last_signal_at", lookup_expr="gte")
    until = django_filters.IsoDateTimeFilter(field_name="started_at", lookup_expr="lte")

    class Meta:
        model = Incident
        fields = ["cluster", "application", "deployment", "kind", "status", "severity", "since", "until"]
