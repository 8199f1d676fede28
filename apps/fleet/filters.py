import django_filters

from apps.accounts.filters import IdFilter
from apps.fleet.models import Application, ConfigRevision, Deployment


class HidesRemoved(django_filters.FilterSet):
    """Rows whose object left the cluster are hidden unless `include_removed` is true."""

    include_removed = django_filters.BooleanFilter(method="keep", label="Include removed rows")

    def keep(self, queryset, name, value):
        return queryset  # applied in filter_queryset, where "not given" can mean "hide"

    def filter_queryset(self, queryset):
        if not self.form.cleaned_data.get("include_removed"):
            queryset = self.when_unfiltered(queryset)
        return super().filter_queryset(queryset)

    @staticmethod
    def when_unfiltered(queryset):
        """What the set does to a list whose request names none of its filters: the API's filter
        backend then applies this alone, without building the form."""
        return queryset.filter(removed_at__isnull=True)


class ApplicationFilter(HidesRemoved):
    cluster = IdFilter(field_name="cluster_id")
    cluster_name = django_filters.CharFilter(field_name="cluster__name")
    status = django_filters.CharFilter(field_name="status", lookup_expr="iexact")

    class Meta:
        model = Application
        fields = ["cluster", "cluster_name", "status", "name"]


class DeploymentFilter(HidesRemoved):
    cluster = IdFilter(field_name="application__cluster_id")
    application = IdFilter(field_name="application_id")
    status = django_filters.CharFilter(field_name="status", lookup_expr="iexact")
    uses_gpu = django_filters.BooleanFilter(method="filter_gpu", label="Requests GPUs")

    class Meta:
        model = Deployment
        fields = ["cluster", "application", "status", "name", "uses_gpu"]

    def filter_gpu(self, queryset, name, value):
        return queryset.filter(num_gpus__gt=0) if value else queryset.exclude(num_gpus__gt=0)


class ConfigRevisionFilter(django_filters.FilterSet):
    cluster = IdFilter(field_name="cluster_id")
    application = IdFilter(field_name="application_id")

    class Meta:
        model = ConfigRevision
        fields = ["cluster", "application", "config_hash"]
