from __future__ import annotations

from django import forms
from django.db.models import Q

from apps.accounts.permissions import visible_teams
from apps.changes.models import Preset, Rollout
from apps.changes.validation import parse_options_text, preset_or_options, validate_options
from apps.clusters.models import Cluster
from apps.core.redaction import redact_config
from apps.fleet.models import Deployment


class OptionsChoice:
    """A preset or typed options, never both: shared by the plan and rollout forms."""

    def clean_options_text(self):
        text = self.cleaned_data["options_text"]
        return parse_options_text(text) if text.strip() else None

    def clean(self):
        data = super().clean()
        # A preset or options that did not parse are explained on their own field already.
        if "preset" not in self.errors and "options_text" not in self.errors:
            preset_or_options(data.get("preset"), data.get("options_text"))
        return data


class PlanForm(OptionsChoice, forms.Form):
    targets = forms.MultipleChoiceField(widget=forms.CheckboxSelectMultiple, help_text="Deployments to change.")
    preset = forms.ModelChoiceField(
        queryset=Preset.objects.none(), required=False, empty_label="— no preset: edit options below —"
    )
    options_text = forms.CharField(
        label="Options (YAML or JSON)",
        required=False,
        widget=forms.Textarea(
            attrs={
                "rows": 8,
                "class": "mono",
                "placeholder": "max_ongoing_requests: 2\nautoscaling_config:\n  target_ongoing_requests: 1",
            }
        ),
        help_text=(
            "Only the options to change; dicts such as autoscaling_config are merged into what runs now. null is "
            "sent as null, never as a removal: autoscaling_config: null with num_replicas turns autoscaling off, a "
            "user_config key: null reaches the app as null, and a null Serve refuses or replaces with its own "
            "default is refused."
        ),
    )
    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}), help_text="Recorded with the change and in the audit log."
    )

    def __init__(self, *args, cluster: Cluster, user, **kwargs):
        super().__init__(*args, **kwargs)
        deployments = Deployment.objects.filter(application__cluster=cluster, removed_at__isnull=True).select_related(
            "application"
        )
        self.fields["targets"].choices = [
            (f"{d.application.name}/{d.name}", f"{d.application.name} / {d.name}") for d in deployments
        ]
        self.fields["preset"].queryset = Preset.objects.filter(Q(builtin=True) | Q(team__in=visible_teams(user)))

    @property
    def target_list(self) -> list[dict]:
        return [
            dict(zip(("application", "deployment"), value.split("/", 1), strict=False))
            for value in self.cleaned_data["targets"]
        ]


class PresetForm(forms.ModelForm):
    options_text = forms.CharField(
        label="Options (YAML or JSON)", widget=forms.Textarea(attrs={"rows": 10, "class": "mono"})
    )

    class Meta:
        model = Preset
        fields = ["name", "team", "description"]

    def __init__(self, *args, teams, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["team"].queryset = teams
        self.fields["team"].required = True
        if self.instance.pk:
            import yaml

            # Saving the form puts the values of the placeholders back (presets.update_preset).
            self.fields["options_text"].initial = yaml.safe_dump(redact_config(self.instance.options), sort_keys=False)

    def clean_options_text(self):
        return validate_options(parse_options_text(self.cleaned_data["options_text"]))


class RolloutForm(OptionsChoice, forms.Form):
    preset = forms.ModelChoiceField(
        queryset=Preset.objects.none(), required=False, empty_label="— no preset: edit options below —"
    )
    options_text = forms.CharField(
        label="Options (YAML or JSON)", required=False, widget=forms.Textarea(attrs={"rows": 5, "class": "mono"})
    )
    team = forms.CharField(required=False, help_text="Team slug.")
    label = forms.CharField(required=False, help_text="Cluster label, key=value or key.")
    application = forms.CharField(required=False, help_text="Application name.")
    deployment = forms.CharField(required=False, help_text="Deployment name.")
    canary = forms.CharField(required=False, help_text="Cluster to change first; default: the first by name.")
    client_error_budget_pct = forms.FloatField(
        label="Client error budget (%)",
        required=False,
        initial=100 * Rollout._meta.get_field("client_error_budget").default,
        min_value=0.0,
        max_value=100.0,
        help_text="A wave whose clients see more failed requests than this at the proxies stops the rollout and "
        "is rolled back.",
    )
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}))

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["preset"].queryset = Preset.objects.filter(Q(builtin=True) | Q(team__in=visible_teams(user)))

    @property
    def selection(self) -> dict:
        return {
            key: self.cleaned_data[key]
            for key in ("team", "label", "application", "deployment")
            if self.cleaned_data.get(key)
        }
