from __future__ import annotations

from django import forms
from django.core.exceptions import ValidationError

from apps.accounts.models import Role
from apps.accounts.permissions import teams_where
from apps.clusters.models import EDITABLE_FIELDS, Cluster
from apps.clusters.validation import (
    labels_text,
    normalize_dashboard_url,
    normalize_optional_url,
    parse_labels_text,
    validate_token,
)


class ClusterForm(forms.Form):
    """The fields of EDITABLE_FIELDS, plus `clear_token`: a password field cannot say "remove"."""

    name = forms.CharField(max_length=63, help_text="Lowercase letters, digits and dashes; cannot change later.")
    team = forms.ModelChoiceField(queryset=None, empty_label=None)
    dashboard_url = forms.CharField(
        label="Ray dashboard URL", max_length=300, widget=forms.URLInput(attrs={"placeholder": "http://ray-head:8265"})
    )
    token = forms.CharField(
        label="Dashboard token",
        required=False,
        max_length=4096,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Only for clusters with token authentication (Ray ≥ 2.52). Stored encrypted, never shown again.",
    )
    clear_token = forms.BooleanField(label="Remove the stored token", required=False)
    serve_config_owner = forms.ChoiceField(
        label="Serve config owned by",
        choices=Cluster.ConfigOwner.choices,
        initial=Cluster.ConfigOwner.DASHBOARD,
        required=False,
        help_text="A cluster whose config a KubeRay RayService owns is never pushed through the dashboard.",
    )
    metrics_url = forms.CharField(
        label="Metrics URL",
        required=False,
        max_length=300,
        help_text=(
            "Ray's Prometheus endpoint (--metrics-export-port), e.g. http://ray-head:8080/metrics. Adds memory and "
            "error evidence to incidents."
        ),
    )
    prometheus_url = forms.CharField(
        label="Prometheus URL",
        required=False,
        max_length=300,
        help_text=(
            "A Prometheus server that scrapes this cluster, e.g. http://prometheus:9090. Read instead of the metrics "
            "URL when set."
        ),
    )
    prometheus_selector = forms.CharField(
        label="Prometheus selector",
        required=False,
        max_length=300,
        widget=forms.TextInput(attrs={"placeholder": 'cluster="gpu-prod"'}),
        help_text='A PromQL label matcher, such as cluster="gpu-prod", that selects this cluster\'s series in that '
        "Prometheus; several are separated by commas, without braces.",
    )
    serve_url = forms.CharField(
        label="Serve HTTP URL",
        required=False,
        max_length=300,
        help_text="Where warmups send requests; empty: the dashboard host on Serve's HTTP port.",
    )
    labels = forms.CharField(
        required=False,
        widget=forms.TextInput(attrs={"placeholder": "env=prod, region=eu"}),
        help_text="Comma-separated key=value pairs.",
    )

    def __init__(self, *args, user, instance: Cluster | None = None, **kwargs):
        self.instance = instance
        if instance is not None:
            initial = {field: getattr(instance, field) for field in EDITABLE_FIELDS if field != "token"}
            kwargs.setdefault("initial", initial | {"labels": labels_text(instance.labels)})
        super().__init__(*args, **kwargs)
        self.fields["team"].queryset = teams_where(user, Role.ADMIN)
        if instance is not None:
            self.fields["name"].disabled = True
            self.fields["token"].help_text = "Leave empty to keep the stored token."
        else:
            del self.fields["clear_token"]

    def clean_name(self):
        name = self.cleaned_data["name"]
        Cluster._meta.get_field("name").run_validators(name)
        if self.instance is None and Cluster.objects.filter(name=name).exists():
            raise ValidationError("A cluster with this name is already registered.")
        return name

    def clean_dashboard_url(self):
        return normalize_dashboard_url(self.cleaned_data["dashboard_url"])

    def clean_token(self):
        return validate_token(self.cleaned_data["token"])

    def clean_metrics_url(self):
        return normalize_optional_url(self.cleaned_data["metrics_url"])

    def clean_prometheus_url(self):
        return normalize_optional_url(self.cleaned_data["prometheus_url"])

    def clean_prometheus_selector(self):
        # The model field's validators, which the API serializer runs too.
        selector = self.cleaned_data["prometheus_selector"]
        Cluster._meta.get_field("prometheus_selector").run_validators(selector)
        return selector

    def clean_serve_url(self):
        return normalize_optional_url(self.cleaned_data["serve_url"])

    def clean_serve_config_owner(self):
        return self.cleaned_data["serve_config_owner"] or Cluster.ConfigOwner.DASHBOARD

    def clean_labels(self):
        return parse_labels_text(self.cleaned_data["labels"])
