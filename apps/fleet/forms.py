"""Forms of the fleet pages."""

from __future__ import annotations

import json

from django import forms

from apps.fleet.request_sizes import UNITS


class LLMPlanInputsForm(forms.Form):
    gpu_memory_gib = forms.FloatField(required=False, min_value=0.001, label="GPU memory (GiB)")
    model_config = forms.CharField(required=False, widget=forms.Textarea, label="The model's config.json")

    def clean_model_config(self) -> dict | None:
        text = self.cleaned_data["model_config"].strip()
        if not text:
            return None
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(f"The model config is not JSON: {exc.msg} at line {exc.lineno}.") from exc
        if not isinstance(value, dict):
            raise forms.ValidationError("The model config is the JSON object of the model's config.json.")
        return value


class SizeMetricForm(forms.Form):
    metric = forms.CharField(required=False, max_length=200, label="Histogram of request sizes")
    unit = forms.ChoiceField(required=False, choices=[(u, u) for u in UNITS], label="What it counts")
