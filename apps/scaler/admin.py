from django.contrib import admin

from apps.scaler.models import Scaler, ScalerDecision


@admin.register(Scaler)
class ScalerAdmin(admin.ModelAdmin):
    list_display = ["id", "deployment", "mode", "min_replicas", "max_replicas", "evaluated_at", "created_at"]
    list_filter = ["mode"]
    raw_id_fields = ["deployment", "created_by"]


@admin.register(ScalerDecision)
class ScalerDecisionAdmin(admin.ModelAdmin):
    list_display = ["id", "scaler", "at", "kind", "current", "target", "applied"]
    list_filter = ["kind", "applied"]
    readonly_fields = [field.name for field in ScalerDecision._meta.fields]

    def has_add_permission(self, request):
        return False
