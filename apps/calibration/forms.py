from __future__ import annotations

import json

from django import forms

from apps.calibration import inputs


class CalibrateForm(forms.Form):
    axis = forms.ChoiceField(
        choices=[("concurrency", "Concurrency (requests in flight)"), ("token_sum", "Token sum of one batch")],
        initial="concurrency",
        required=False,
        help_text=(
            "Token sum needs a calibration_batch(token_sum) method on the deployment class; it sizes max_batch_tokens."
        ),
    )
    levels = forms.CharField(
        required=False,
        max_length=100,
        widget=forms.TextInput(
            attrs={
                "placeholder": (
                    f"{','.join(map(str, inputs.DEFAULT_LEVELS))} or {','.join(map(str, inputs.DEFAULT_TOKEN_SUMS))}"
                ),
            }
        ),
        help_text="Concurrency levels or token sums to measure, separated by commas; empty: the axis's defaults.",
    )
    method = forms.ChoiceField(
        label="HTTP method",
        required=False,
        choices=[("", "—"), *((m, m) for m in inputs.HTTP_METHODS)],
        help_text="An HTTP request for a Starlette or FastAPI deployment; empty with no path: the default request.",
    )
    path = forms.CharField(
        label="Path",
        required=False,
        max_length=500,
        widget=forms.TextInput(attrs={"placeholder": "/route/sub"}),
        help_text="The full path a client asks for, route prefix included.",
    )
    query = forms.CharField(
        label="Query string", required=False, max_length=2000, widget=forms.TextInput(attrs={"placeholder": "a=1&b=2"})
    )
    headers = forms.CharField(
        label="Headers",
        required=False,
        widget=forms.Textarea(attrs={"rows": 2, "class": "mono", "placeholder": "content-type: application/json"}),
        help_text="One `Name: value` per line.",
    )
    body = forms.CharField(
        label="Body", required=False, strip=False, widget=forms.Textarea(attrs={"rows": 2, "class": "mono"})
    )
    call = forms.CharField(
        label="Handle call argument (JSON)",
        required=False,
        widget=forms.Textarea(attrs={"rows": 2, "class": "mono"}),
        help_text="For a deployment called through a handle: each __call__ gets this one argument. Leave the HTTP "
        "fields empty. All empty: the application's warmup request, a GET of its route prefix for its "
        "ingress, else a call with no argument.",
    )

    mix = forms.CharField(
        label="Mix of requests (JSON)",
        required=False,
        widget=forms.Textarea(
            attrs={
                "rows": 3,
                "class": "mono",
                "placeholder": '[{"request": {"kind": "http", "path": "/app", "query": "size=small"}, "share": 80}, '
                '{"request": {"kind": "http", "path": "/app", "query": "size=large"}, "share": 20}]',
            }
        ),
        help_text=f"Instead of one request: {inputs.MIX_HELP} Leave the request fields above empty.",
    )

    def clean_mix(self):
        text = self.cleaned_data["mix"].strip()
        if not text:
            return None
        if text in (inputs.WARMUP_MIX, inputs.OBSERVED_MIX):
            return text
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(
                f'Not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno}). Give a list, or "{inputs.WARMUP_MIX}".'
            ) from exc

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
            raise forms.ValidationError(
                f"Not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno}). A string needs quotes."
            ) from exc
        inputs.validate_call(call)
        return call

    def clean_headers(self) -> dict:
        headers = {}
        for number, line in enumerate(self.cleaned_data["headers"].splitlines(), start=1):
            if not line.strip():
                continue
            name, colon, value = line.partition(":")
            if not colon or not name.strip():
                raise forms.ValidationError(f"Line {number} is not `Name: value`.")
            headers[name.strip()] = value.strip()
        return headers

    def _request(self, cleaned: dict) -> dict | None:
        """The representative HTTP request the fields describe, or None when they are all empty."""
        method, path = cleaned.get("method"), (cleaned.get("path") or "").strip()
        if not (method or path or cleaned.get("query") or cleaned.get("headers") or cleaned.get("body")):
            return None
        if not path:
            self.add_error("path", "Give the path of the HTTP request, such as /route/sub.")
            return None
        if cleaned.get("call") is not None:
            self.add_error("call", "Give an HTTP request or a handle call argument, not both.")
            return None
        request = {
            "kind": "http",
            "method": method or "GET",
            "path": path,
            "query": cleaned.get("query", "").strip(),
            "headers": cleaned.get("headers") or {},
        }
        if cleaned.get("body"):
            request["body"] = cleaned["body"]
        try:
            return inputs.validate_request(request)
        except forms.ValidationError as exc:
            self.add_error(None, exc)
            return None

    def clean(self):
        cleaned = super().clean()
        cleaned["request"] = self._request(cleaned)
        # Levels are judged by the axis they count: 4,096 is a fine token sum but no concurrency.
        axis, levels = cleaned.get("axis"), cleaned.get("levels")
        if axis and "levels" in cleaned:
            try:
                cleaned["levels"] = inputs.validate_levels(
                    inputs.DEFAULTS_BY_AXIS[axis] if levels is None else levels, axis
                )
            except forms.ValidationError as exc:
                self.add_error("levels", exc)
        mix = cleaned.get("mix")
        if mix == inputs.OBSERVED_MIX:
            pass  # the request is the template each observed size fills in; the service checks both
        elif mix is not None and (cleaned.get("request") is not None or cleaned.get("call") is not None):
            self.add_error("mix", "Give a mix or one representative request, not both.")
        elif mix is not None and mix != inputs.WARMUP_MIX:
            try:
                cleaned["mix"] = inputs.validate_mix(mix, len(cleaned.get("levels") or [1]))
            except forms.ValidationError as exc:
                self.add_error("mix", " ".join(exc.messages))
        return cleaned
