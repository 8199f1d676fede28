from __future__ import annotations

from django import forms
from django.core.exceptions import ValidationError

from apps.accounts.models import Role
from apps.accounts.permissions import teams_where
from apps.clusters.models import Cluster
from apps.clusters.validation import normalize_dashboard_url, parse_labels_text, validate_token
from apps.kubernetes.models import KubeConnection, KubeLink
from apps.kubernetes.services import can_use_in_cluster
from apps.kubernetes.validation import validate_cluster_name, validate_namespaces


class ConnectionForm(forms.Form):
    name = forms.CharField(
        max_length=63, help_text="Lowercase letters, digits and dashes, e.g. prod-eu; cannot change later."
    )
    team = forms.ModelChoiceField(
        queryset=None, empty_label=None, help_text="The team whose admins manage this connection."
    )
    in_cluster = forms.BooleanField(
        label="Use Fleetdeck's own service account (Fleetdeck runs in this Kubernetes cluster)",
        required=False,
        help_text="Superusers only: this account can read every team's namespaces.",
    )
    kubeconfig = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 8, "autocomplete": "off", "spellcheck": "false"}),
        help_text=(
            "A kubeconfig with a token or client certificate, inline (token, *-data): credential plugins, file paths "
            "and proxy-url are refused. Stored encrypted, never shown again."
        ),
    )
    context = forms.CharField(
        label="Kubeconfig context", required=False, max_length=253, help_text="Empty: the kubeconfig's current-context."
    )
    namespaces = forms.CharField(
        widget=forms.TextInput(attrs={"placeholder": "ml, ray-serve"}),
        help_text="Comma-separated. Fleetdeck looks for RayClusters and RayServices only here.",
    )
    read_only = forms.BooleanField(
        label="Read-only",
        required=False,
        initial=True,
        help_text=(
            "Untick to let changes patch RayServices' serveConfigV2 (needs the fleetdeck-rayservice-writer role)."
        ),
    )

    def __init__(self, *args, user, instance: KubeConnection | None = None, **kwargs):
        self.instance = instance
        if instance is not None:
            kwargs.setdefault(
                "initial",
                {
                    "name": instance.name,
                    "team": instance.team,
                    "in_cluster": instance.in_cluster,
                    "context": instance.context,
                    "namespaces": ", ".join(instance.namespaces),
                    "read_only": instance.read_only,
                },
            )
        super().__init__(*args, **kwargs)
        self.fields["team"].queryset = teams_where(user, Role.ADMIN)
        superuser = can_use_in_cluster(user)
        if instance is not None:
            for name in ("name", "team", "in_cluster"):
                self.fields[name].disabled = True
            if instance.in_cluster and not superuser:
                self.fields["namespaces"].disabled = True
                self.fields[
                    "namespaces"
                ].help_text = (
                    "Only a superuser changes the namespaces of a connection that uses Fleetdeck's own service account."
                )
            self.fields["kubeconfig"].help_text = "Leave empty to keep the stored kubeconfig."
        elif not superuser:
            # A disabled field keeps its initial False whatever is posted; the service refuses it as well.
            self.fields["in_cluster"].disabled = True
            self.fields["in_cluster"].widget = forms.HiddenInput()

    def clean_namespaces(self):
        return validate_namespaces(self.cleaned_data["namespaces"])


class RegisterForm(forms.Form):
    cluster_name = forms.CharField(label="Cluster name in Fleetdeck", max_length=63)
    dashboard_url = forms.CharField(
        label="Ray dashboard URL",
        required=False,
        max_length=300,
        help_text=(
            "Empty: the head service KubeRay created (for a RayService, the one that follows its active RayCluster)."
        ),
    )
    token = forms.CharField(
        label="Dashboard token",
        required=False,
        max_length=4096,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Only for clusters with token authentication (Ray ≥ 2.52). Stored encrypted.",
    )
    labels = forms.CharField(required=False, widget=forms.TextInput(attrs={"placeholder": "env=prod, region=eu"}))

    def clean_cluster_name(self):
        return validate_cluster_name(self.cleaned_data["cluster_name"])

    def clean_dashboard_url(self):
        url = self.cleaned_data["dashboard_url"].strip()
        return normalize_dashboard_url(url) if url else ""

    def clean_token(self):
        return validate_token(self.cleaned_data["token"])

    def clean_labels(self):
        return parse_labels_text(self.cleaned_data["labels"])


class LinkForm(forms.Form):
    cluster = forms.ModelChoiceField(queryset=None, empty_label=None, label="Cluster")
    kind = forms.ChoiceField(choices=KubeLink.Kind.choices, widget=forms.HiddenInput)
    namespace = forms.CharField(max_length=63, widget=forms.HiddenInput)
    name = forms.CharField(max_length=253, widget=forms.HiddenInput)

    def __init__(self, *args, connection: KubeConnection, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["cluster"].queryset = linkable_clusters(connection)

    def clean_cluster(self):
        cluster = self.cleaned_data["cluster"]
        if KubeLink.objects.filter(cluster=cluster).exists():
            raise ValidationError(f"{cluster.name} is already linked.")
        return cluster


def linkable_clusters(connection: KubeConnection):
    """The connection's team's clusters that are not linked yet."""
    return Cluster.objects.filter(team=connection.team, kube_link__isnull=True).order_by("name")
