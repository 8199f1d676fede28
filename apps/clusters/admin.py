"""The network allow-list, kept by administrators (superusers) in the Django admin: it decides
which addresses every team's clusters, metrics, Prometheus and webhooks may point at (an entry
with a team, that team's alone), so no team role may edit it. Every edit is in the audit log."""

from django.conf import settings
from django.contrib import admin, messages

from apps.accounts.audit import Actor, record
from apps.clusters.models import EgressRule


@admin.register(EgressRule)
class EgressRuleAdmin(admin.ModelAdmin):
    list_display = ["value", "kind", "team", "note", "created_by", "created_at"]
    list_filter = ["kind", "team"]
    search_fields = ["value", "note"]
    fields = ["kind", "value", "team", "note"]

    def has_module_permission(self, request):
        return request.user.is_active and request.user.is_superuser

    def has_view_permission(self, request, obj=None):
        return self.has_module_permission(request)

    has_add_permission = has_module_permission

    def has_change_permission(self, request, obj=None):
        return self.has_module_permission(request)

    def has_delete_permission(self, request, obj=None):
        return self.has_module_permission(request)

    def changelist_view(self, request, extra_context=None):
        if settings.FLEETDECK_CLUSTER_NETWORKS:
            messages.info(
                request, "Also allowed by FLEETDECK_CLUSTER_NETWORKS: " + ", ".join(settings.FLEETDECK_CLUSTER_NETWORKS)
            )
        elif not EgressRule.objects.exists():
            messages.warning(
                request,
                "The allow-list is empty: Fleetdeck calls no cluster, metrics endpoint, Prometheus or webhook. "
                "Add the networks and hosts your clusters live on, for every team or for one team.",
            )
        return super().changelist_view(request, extra_context)

    def save_model(self, request, obj, form, change):
        if not change:
            obj.created_by = request.user
        super().save_model(request, obj, form, change)
        record(
            Actor.from_request(request, via="admin"),
            "egress_rule.change" if change else "egress_rule.add",
            obj,
            changes={"kind": obj.kind, "value": obj.value, "team": obj.team.slug if obj.team else "", "note": obj.note},
        )

    def delete_model(self, request, obj):
        self._record_removal(request, obj)
        super().delete_model(request, obj)

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            self._record_removal(request, obj)
        super().delete_queryset(request, queryset)

    def _record_removal(self, request, obj):
        record(
            Actor.from_request(request, via="admin"),
            "egress_rule.delete",
            obj,
            changes={"kind": obj.kind, "value": obj.value},
        )
