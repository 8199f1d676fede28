from __future__ import annotations

import json

from django import forms

from apps.maintenance.models import RecycleSchedule, WarmupProfile

DAYS = [(0, "Mon"), (1, "Tue"), (2, "Wed"), (3, "Thu"), (4, "Fri"), (5, "Sat"), (6, "Sun")]
WINDOW_FIELDS = ["window_days", "window_start_hour", "window_end_hour", "timezone"]


class WindowFields(forms.ModelForm):
    window_days = forms.TypedMultipleChoiceField(
        choices=DAYS, coerce=int, required=False, widget=forms.CheckboxSelectMultiple, help_text="None checked: every day."
    )


class ScheduleForm(WindowFields):
    class Meta:
        model = RecycleSchedule
        fields = ["enabled", "every_hours", "cron", *WINDOW_FIELDS, "warmup"]

    def __init__(self, *args, application, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["warmup"].queryset = WarmupProfile.objects.filter(application=application)
        self.fields["warmup"].help_text = "Run this warmup after every recycle."


class ProfileForm(WindowFields):
    headers_text = forms.CharField(label="Headers (JSON object)", required=False, widget=forms.Textarea(attrs={"rows": 2, "class": "mono"}))
    body_text = forms.CharField(label="JSON body", required=False, widget=forms.Textarea(attrs={"rows": 3, "class": "mono"}))

    class Meta:
        model = WarmupProfile
        fields = ["name", "method", "path", "requests", "concurrency", "timeout_s", "p95_threshold_ms", "every_hours", *WINDOW_FIELDS, "enabled"]

    def _json(self, field, default):
        text = self.cleaned_data[field].strip()
        if not text:
            return default
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(f"Not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}.") from exc

    def clean_headers_text(self):
        return self._json("headers_text", {})

    def clean_body_text(self):
        return self._json("body_text", None)

    def service_data(self) -> dict:
        data = {key: self.cleaned_data[key] for key in self.Meta.fields}
        data.update(headers=self.cleaned_data["headers_text"], body=self.cleaned_data["body_text"])
        return data
