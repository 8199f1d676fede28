from __future__ import annotations

import json

from django import forms

from apps.calibration import services


class CalibrateForm(forms.Form):
    levels = forms.CharField(initial=",".join(str(k) for k in services.DEFAULT_LEVELS), max_length=100,
                             help_text="Concurrency levels to measure, separated by commas.")
    call = forms.CharField(label="Request argument (JSON)", required=False, widget=forms.Textarea(attrs={"rows": 2, "class": "mono"}),
                           help_text="Passed as the one argument of each __call__; empty: called with no argument.")

    def clean_levels(self) -> list[int]:
        try:
            levels = [int(part) for part in self.cleaned_data["levels"].split(",") if part.strip()]
        except ValueError as exc:
            raise forms.ValidationError("Levels are whole numbers separated by commas, such as 1,2,4.") from exc
        return services.validate_levels(levels)

    def clean_call(self):
        text = self.cleaned_data["call"].strip()
        if not text:
            return None
        try:
            call = json.loads(text)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(f"Not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno}). A string needs quotes.") from exc
        services.validate_call(call)
        return call
