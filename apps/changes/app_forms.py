"""The pages' forms for deploying and deleting a whole application."""

from __future__ import annotations

from typing import Any

from django import forms

from apps.changes.validation import parse_yaml_text
from apps.clusters.models import Cluster
from apps.fleet.models import Application


class NewApplicationForm(forms.Form):
    name = forms.CharField(max_length=100)
    route_prefix = forms.CharField(
        max_length=300,
        initial="/",
        required=False,
        help_text="Starts with '/'. Leave empty for an application with no HTTP route.",
    )
    import_path = forms.CharField(max_length=500, help_text="module:attribute, e.g. my_app.main:app.")
    runtime_env = forms.CharField(
        label="runtime_env (YAML or JSON)",
        required=False,
        widget=forms.Textarea(
            attrs={
                "rows": 5,
                "class": "mono",
                "placeholder": (
                    "working_dir: https://example.com/my_app.zip\npip: [requests==2.32.3]\nenv_vars:\n  MODE: prod"
                ),
            }
        ),
        help_text="working_dir must be a URI (s3://, gs://, https://….zip, or local:// for a directory on every node).",
    )
    args = forms.CharField(
        label="args (YAML or JSON)",
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "class": "mono"}),
        help_text="Passed to the application's builder.",
    )
    deployments = forms.CharField(
        label="Deployment options (YAML or JSON list)",
        required=False,
        widget=forms.Textarea(
            attrs={
                "rows": 6,
                "class": "mono",
                "placeholder": "- name: Model\n  num_replicas: 2\n  max_ongoing_requests: 4",
            }
        ),
    )
    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}), help_text="Recorded with the change and in the audit log."
    )

    def _parsed(self, field: str, kind: type) -> Any:
        text = self.cleaned_data[field]
        return parse_yaml_text(text, kind, field) if text.strip() else None

    def clean_runtime_env(self):
        return self._parsed("runtime_env", dict)

    def clean_args(self):
        return self._parsed("args", dict)

    def clean_deployments(self):
        return self._parsed("deployments", list)

    @property
    def application(self) -> dict:
        data = self.cleaned_data
        app = {"name": data["name"], "import_path": data["import_path"], "route_prefix": data["route_prefix"] or None}
        app |= {key: data[key] for key in ("runtime_env", "args", "deployments") if data.get(key) is not None}
        return app


class DeleteApplicationForm(forms.Form):
    application = forms.ChoiceField()
    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}), help_text="Recorded with the change and in the audit log."
    )

    def __init__(self, *args, cluster: Cluster, **kwargs):
        super().__init__(*args, **kwargs)
        names = Application.objects.filter(cluster=cluster, removed_at__isnull=True).order_by("name")
        self.fields["application"].choices = [(name, name) for name in names.values_list("name", flat=True)]
