from django.contrib import admin

from apps.calibration.models import MemoryCalibration


@admin.register(MemoryCalibration)
class MemoryCalibrationAdmin(admin.ModelAdmin):
    list_display = ["id", "cluster", "application_name", "deployment_name", "state", "axis", "device", "created_at"]
    list_filter = ["state", "axis", "device"]
    search_fields = ["application_name", "deployment_name", "submission_id"]
    exclude = ["headers_ciphertext"]
    readonly_fields = [field.name for field in MemoryCalibration._meta.fields if field.name != "headers_ciphertext"]

    def has_add_permission(self, request):
        return False
