"""The "Memory calibration" card of the deployment page: the latest curve, a running
calibration (polled by htmx until final), and the form that starts one."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from apps.accounts import access
from apps.accounts.audit import Actor
from apps.accounts.models import Role
from apps.accounts.permissions import has_role
from apps.calibration import inputs, services
from apps.calibration.curve import MIB
from apps.calibration.forms import CalibrateForm
from apps.calibration.job_script import describe
from apps.calibration.mix import QUANTILE_TEXT
from apps.fleet.models import Deployment
from apps.incidents.request_sizes import observed as observed_sizes

CARD = "calibration/partials/card.html"


def card_context(request, deployment: Deployment, form: CalibrateForm | None = None) -> dict:
    """Everything the card shows; the deployment page puts it under `calibration`."""
    latest = services.calibrations_of(deployment).order_by("-created_at", "-id").first()
    measured = services.latest_succeeded(deployment)
    curve = services.curve_of(measured) if measured else None
    return {
        "deployment": deployment,
        "latest": latest,
        "measured": measured,
        "curve": curve,
        "chart": _chart(curve) if curve else None,
        "levels": _levels(curve, measured) if curve else [],
        "representative": _representative(measured),
        "mix": _mix(curve) if curve is not None and curve.is_mixed else None,
        # Where an observed mix came from: the histogram, its span, the requests it counted.
        "mix_from": (measured.request or {}).get("mix_from") if measured else None,
        "form": form or CalibrateForm(),
        # One calibration at a time per deployment: no form while one runs.
        "can_start": (latest is None or latest.is_final)
        and has_role(request.user, deployment.application.cluster.team, Role.OPERATOR),
        "poll_s": 2,
    }


def _levels(curve: services.Curve, measured) -> list[dict]:
    """One row per measured level, in MiB and seconds."""
    uss = {float(point["x"]): point.get("uss_peak_bytes") for point in measured.points}
    return [
        {
            "x": x,
            "peak_mib": peak / MIB,
            "above_mib": (peak - curve.baseline_bytes) / MIB,
            "uss_mib": uss[x] / MIB if uss.get(x) is not None else None,
            "service_s": curve.service_s.get(x),
        }
        for x, peak in curve.points
    ]


def _mix(curve: services.Curve) -> dict:
    """Each request of the mix with its share and increment, and per measured level the peak
    sizing reads (the quantile of that many requests drawn from the mix) beside the peak if every
    request were the largest share's."""
    return {
        "quantile": QUANTILE_TEXT,
        "entries": [
            {
                "label": e.label,
                "share": e.share,
                "increment_mib": e.increment_bytes / MIB,
                "tokens": e.tokens,
                "limit_reason": e.limit_reason,
            }
            for e in curve.mix
        ],
        "peaks": [
            {"x": x, "mix_mib": curve.mix_peak(int(x)) / MIB, "typical_mib": peak / MIB} for x, peak in curve.points
        ],
    }


def _representative(measured) -> str:
    request = (measured.request or {}).get("representative") if measured else None
    return describe(request) if request and measured.axis == "concurrency" else ""


def _chart(curve: services.Curve) -> dict:
    return {
        "axis": "requests in flight" if curve.axis == "concurrency" else "token sum per batch",
        "points": [{"x": x, "y": round(peak / MIB, 1)} for x, peak in curve.points],
        "baseline": round(curve.baseline_bytes / MIB, 1),
        "x_max": max((x for x, _ in curve.points), default=1),
    }


def _deployment(request, pk: int) -> Deployment:
    return access.get_visible_or_404(
        request.user, Deployment.objects.select_related("application__cluster__team"), pk=pk
    )


@login_required
def card(request, deployment_pk: int):
    deployment = _deployment(request, deployment_pk)
    if not request.htmx:
        return redirect("fleet:deployment", pk=deployment.pk)
    return render(request, CARD, {"calibration": card_context(request, deployment)})


@login_required
@require_POST
def calibrate(request, deployment_pk: int):
    deployment = _deployment(request, deployment_pk)
    access.demand(request.user, deployment.application.cluster.team, services.CALIBRATE)
    form = CalibrateForm(request.POST)
    if form.is_valid():
        try:
            calibration = services.request_calibration(
                Actor.from_request(request),
                deployment,
                axis=form.cleaned_data["axis"],
                levels=form.cleaned_data["levels"],
                call=form.cleaned_data["call"],
                request=form.cleaned_data["request"],
                mix=form.cleaned_data["mix"],
                observed=observed_sizes(deployment) if form.cleaned_data["mix"] == inputs.OBSERVED_MIX else None,
            )
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            if not request.htmx:
                messages.success(
                    request, f"Calibration #{calibration.pk} submitted as Ray job {calibration.submission_id}."
                )
                return redirect("fleet:deployment", pk=deployment.pk)
            form = None
    if request.htmx:
        return render(request, CARD, {"calibration": card_context(request, deployment, form)})
    for errors in form.errors.values():
        for error in errors:
            messages.error(request, error)
    return redirect("fleet:deployment", pk=deployment.pk)
