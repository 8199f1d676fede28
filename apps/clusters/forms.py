from __future__ import annotations

from django import forms
from django.core.exceptions import ValidationError

from apps.accounts.models import Role
from apps.accounts.permissions import teams_where
from apps.clusters.models import Cluster
from apps.clusters.validation import labels_text, normalize_dashboard_url, parse_labels_text, validate_token


class ClusterForm(forms.Form):
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
        label="Metrics URL", required=False, max_length=300,
        help_text="Ray's Prometheus endpoint (--metrics-export-port), e.g. http://ray-head:8080/metrics. Adds memory and error evidence to incidents.",
    )
    serve_url = forms.CharField(
        label="Serve HTTP URL", required=False, max_length=300,
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
            kwargs.setdefault(
                "initial",
                {
                    "name": instance.name,
                    "team": instance.team,
                    "dashboard_url": instance.dashboard_url,
                    "labels": labels_text(instance.labels),
                    "serve_config_owner": instance.serve_config_owner,
                    "metrics_url": instance.metrics_url,
                    "serve_url": instance.serve_url,
                },
            )
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
        return normalize_dashboard_url(self.cleaned_data["metrics_url"]) if self.cleaned_data["metrics_url"].strip() else ""

    def clean_serve_url(self):
        return normalize_dashboard_url(self.cleaned_data["serve_url"]) if self.cleaned_data["serve_url"].strip() else ""

    def clean_serve_config_owner(self):
        return self.cleaned_data["serve_config_owner"] or Cluster.ConfigOwner.DASHBOARD

    def clean_labels(self):
        return parse_labels_text(self.cleaned_data["labels"])
