from __future__ import annotations

import json

from django import forms

from apps.calibration import services


class CalibrateForm(forms.Form):
    axis = forms.ChoiceField(
        choices=[("concurrency", "Concurrency (requests in flight)"), ("token_sum", "Token sum of one batch")],
        initial="concurrency", required=False,
        help_text="Token sum needs a calibration_batch(token_sum) method on the deployment class; it sizes max_batch_tokens.",
    )
    levels = forms.CharField(
        required=False, max_length=100,
        widget=forms.TextInput(attrs={
            "placeholder": f"{','.join(map(str, services.DEFAULT_LEVELS))} or {','.join(map(str, services.DEFAULT_TOKEN_SUMS))}",
        }),
        help_text="Concurrency levels or token sums to measure, separated by commas; empty: the axis's defaults.",
    )
    call = forms.CharField(label="Request argument (JSON)", required=False, widget=forms.Textarea(attrs={"rows": 2, "class": "mono"}),
                           help_text="Passed as the one argument of each __call__ (concurrency only); empty: called with no argument.")

    def clean_axis(self) -> str:
        return self.cleaned_data["axis"] or "concurrency"

    def clean_levels(self) -> list[int] | None:
        text = self.cleaned_data["levels"].strip()
        if not text:
            return None
        try:
            return [int(part) for part in text.split(",") if part.strip()]
        except ValueError as exc:
            raise forms.ValidationError("Levels are whole numbers separated by commas, such as 1,2,4.") from exc

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

    def clean(self):
        cleaned = super().clean()
        # Levels are judged by the axis they count: 4,096 is a fine token sum but no concurrency.
        axis, levels = cleaned.get("axis"), cleaned.get("levels")
        if axis and "levels" in cleaned:
            try:
                cleaned["levels"] = services.validate_levels(services.DEFAULTS_BY_AXIS[axis] if levels is None else levels, axis)
            except forms.ValidationError as exc:
                self.add_error("levels", exc)
        return cleaned
