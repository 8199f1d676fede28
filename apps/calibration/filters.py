from __future__ import annotations

import django_filters

from apps.calibration.models import MemoryCalibration


class CalibrationFilter(django_filters.FilterSet):
    cluster = django_filters.NumberFilter(field_name="cluster_id")
    deployment = django_filters.NumberFilter(field_name="deployment_id")

    class Meta:
        model = MemoryCalibration
        fields = ["cluster", "deployment", "state", "axis", "device", "application_name", "deployment_name"]
