from __future__ import annotations

import json

from django import forms

from apps.maintenance.models import RecycleSchedule, WarmupProfile

DAYS = [(0, "Mon"), (1, "Tue"), (2, "Wed"), (3, "Thu"), (4, "Fri"), (5, "Sat"), (6, "Sun")]
WINDOW_FIELDS = ["window_days", "window_start_hour", "window_end_hour", "timezone"]
WINDOW_LABELS = {
    "window_start_hour": "Window opens at (hour)",
    "window_end_hour": "Window closes at (hour)",
    "timezone": "Time zone",
}
WINDOW_HELP = {
    "window_start_hour": "0–23, in the time zone below.",
    "window_end_hour": "1–24; an hour before the opening wraps past midnight (22 to 4).",
    "timezone": "An IANA name, e.g. Europe/Berlin or UTC.",
}


class WindowFields(forms.ModelForm):
    window_days = forms.TypedMultipleChoiceField(
        label="Window days",
        choices=DAYS,
        coerce=int,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="None checked: every day.",
    )


class ScheduleForm(WindowFields):
    class Meta:
        model = RecycleSchedule
        fields = ["enabled", "every_hours", "cron", *WINDOW_FIELDS, "warmup"]
        labels = {
            "enabled": "Enabled",
            "every_hours": "Recycle every (hours)",
            "cron": "Cron expression",
            "warmup": "Warmup afterwards",
            **WINDOW_LABELS,
        }
        help_texts = {
            "enabled": "Untick to pause recycles and keep the schedule.",
            "every_hours": "1–720 hours between recycles; leave empty to use a cron expression instead.",
            "cron": "Five fields (minute hour day month weekday) in the time zone below, e.g. 0 3 * * 1; "
            "leave empty to recycle every N hours.",
            **WINDOW_HELP,
        }

    def __init__(self, *args, application, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["warmup"].queryset = WarmupProfile.objects.filter(application=application)
        self.fields["warmup"].help_text = "Run this warmup after every recycle."


class ProfileForm(WindowFields):
    headers_text = forms.CharField(
        label="Headers (JSON object)", required=False, widget=forms.Textarea(attrs={"rows": 2, "class": "mono"})
    )
    body_text = forms.CharField(
        label="JSON body", required=False, widget=forms.Textarea(attrs={"rows": 3, "class": "mono"})
    )

    class Meta:
        model = WarmupProfile
        fields = [
            "name",
            "method",
            "path",
            "requests",
            "concurrency",
            "timeout_s",
            "p95_threshold_ms",
            "every_hours",
            *WINDOW_FIELDS,
            "enabled",
        ]
        labels = {
            "method": "HTTP method",
            "requests": "Requests to send",
            "concurrency": "Requests at a time",
            "timeout_s": "Timeout per request (seconds)",
            "p95_threshold_ms": "Slowest acceptable p95 (ms)",
            "every_hours": "Also run every (hours)",
            **WINDOW_LABELS,
        }
        help_texts = {
            "method": "GET, POST, PUT or HEAD.",
            "path": "Under the application's route prefix, e.g. /predict.",
            "requests": "1–1000; the first is sent alone and times the cold start.",
            "concurrency": "1–64 of the other requests in flight at once.",
            "timeout_s": "Above 0 and at most 300; a request slower than this counts as failed.",
            "p95_threshold_ms": "The warmup fails when its p95 latency is above this; empty: no latency criterion.",
            "every_hours": "1–720; empty: only after recycles and on demand.",
            "enabled": "Untick to stop its scheduled runs.",
            **WINDOW_HELP,
        }

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
