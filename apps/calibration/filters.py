from __future__ import annotations

import django_filters

from apps.accounts.filters import IdFilter
from apps.calibration.models import MemoryCalibration


class CalibrationFilter(django_filters.FilterSet):
    cluster = IdFilter(field_name="cluster_id")
    deployment = IdFilter(field_name="deployment_id")

    class Meta:
        model = MemoryCalibration
        fields = ["cluster", "deployment", "state", "axis", "device", "application_name", "deployment_name"]
