import django_filters

from apps.accounts.filters import IdFilter
from apps.remediation.models import Finding


class FindingFilter(django_filters.FilterSet):
    """The findings page and the findings API list filter alike. `muted` keeps the API's meaning
    (true: only muted, false: only the others); the page's own "show muted as well" is its
    leaving `muted` out."""

    cluster = IdFilter(field_name="cluster_id")
    open = django_filters.BooleanFilter(field_name="resolved_at", lookup_expr="isnull", label="Still firing")
    muted = django_filters.BooleanFilter(field_name="muted_at", lookup_expr="isnull", exclude=True, label="Muted")

    class Meta:
        model = Finding
        fields = ["cluster", "rule", "severity", "application_name", "deployment_name", "subject", "open", "muted"]
