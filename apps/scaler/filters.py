from __future__ import annotations

import django_filters

from apps.accounts.filters import IdFilter
from apps.scaler.models import Scaler, ScalerDecision


class ScalerFilter(django_filters.FilterSet):
    deployment = IdFilter(field_name="deployment_id")
    cluster = IdFilter(field_name="deployment__application__cluster_id")

    class Meta:
        model = Scaler
        fields = ["deployment", "cluster", "mode"]


class DecisionFilter(django_filters.FilterSet):
    scaler = IdFilter(field_name="scaler_id")
    deployment = IdFilter(field_name="scaler__deployment_id")

    class Meta:
        model = ScalerDecision
        fields = ["scaler", "deployment", "kind", "applied"]
