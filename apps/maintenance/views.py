"""Maintenance pages: a deployment's recycle schedule and "Recycle now", warmup profiles, runs."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from apps.accounts import access
from apps.accounts.audit import Actor
from apps.accounts.models import Role
from apps.accounts.permissions import has_role
from apps.core.jobs import unclaimed_for
from apps.fleet.models import Application, Deployment
from apps.maintenance import dispatch, schedules
from apps.maintenance.forms import ProfileForm, ScheduleForm
from apps.maintenance.models import MaintenanceRun, RecycleSchedule, WarmupProfile


def _deployment(request, pk: int) -> Deployment:
    return access.get_visible_or_404(
        request.user, Deployment.objects.select_related("application__cluster__team"), pk=pk
    )


@login_required
def schedule_edit(request, deployment_pk: int):
    deployment = _deployment(request, deployment_pk)
    access.demand(request.user, deployment.application.cluster.team, schedules.MANAGE)
    instance = RecycleSchedule.objects.filter(deployment=deployment).first()
    form = ScheduleForm(request.POST or None, instance=instance, application=deployment.application)
    if request.method == "POST" and form.is_valid():
        try:
            schedules.save_schedule(
                Actor.from_request(request), deployment, {k: form.cleaned_data[k] for k in ScheduleForm.Meta.fields}
            )
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            return redirect("fleet:deployment", pk=deployment.pk)
    return render(request, "maintenance/schedule_form.html", {"form": form, "deployment": deployment})


@login_required
@require_POST
def recycle_now(request, deployment_pk: int):
    deployment = _deployment(request, deployment_pk)
    access.demand(request.user, deployment.application.cluster.team, dispatch.RECYCLE)
    override = request.POST.get("override_reason", "").strip() if request.POST.get("override") else ""
    run = dispatch.request_recycle(Actor.from_request(request), deployment, override_reason=override)
    return redirect("maintenance:run", pk=run.pk)


@login_required
def warmups(request, application_pk: int):
    application = access.get_visible_or_404(
        request.user, Application.objects.select_related("cluster__team"), pk=application_pk
    )
    can_operate = has_role(request.user, application.cluster.team, Role.OPERATOR)
    form = ProfileForm(request.POST or None, initial={"path": application.route_prefix or "/"})
    if request.method == "POST":
        access.demand(request.user, application.cluster.team, schedules.MANAGE)
        if form.is_valid():
            try:
                schedules.save_profile(Actor.from_request(request), application, form.service_data())
            except ValidationError as exc:
                form.add_error(None, exc)
            else:
                return redirect("maintenance:warmups", application_pk=application.pk)
    context = {
        "application": application,
        "profiles": application.warmup_profiles.all(),
        "form": form,
        "can_operate": can_operate,
    }
    return render(request, "maintenance/warmups.html", context)


@login_required
@require_POST
def warmup_run(request, pk: int):
    profile = access.get_visible_or_404(
        request.user, WarmupProfile.objects.select_related("application__cluster__team"), pk=pk
    )
    access.demand(request.user, profile.application.cluster.team, dispatch.WARM_UP)
    run = dispatch.request_warmup(Actor.from_request(request), profile)
    return redirect("maintenance:run", pk=run.pk)


@login_required
def run_detail(request, pk: int):
    run = access.get_visible_or_404(
        request.user,
        MaintenanceRun.objects.select_related("cluster", "deployment__application", "profile", "change"),
        pk=pk,
    )
    samples = run.results.get("samples", []) if run.results else []
    peak = max([s["ms"] for s in samples], default=1) or 1
    bars = []
    for i, sample in enumerate(samples):
        height = max(1.0, sample["ms"] / peak * 100)
        ok = sample["status"] is not None and 200 <= sample["status"] < 300
        bars.append({"x": i * 12, "y": round(105 - height, 1), "h": round(height, 1), "ms": sample["ms"], "ok": ok})
    context = {
        "run": run,
        "bars": bars,
        "chart_width": max(len(bars) * 12, 12),
        "waiting_s": unclaimed_for(run.enqueued_at) if run.state == MaintenanceRun.State.QUEUED else None,
        "resend_s": settings.FLEETDECK_CHANGE_STALE_S,
    }
    template = "maintenance/partials/run_live.html" if request.htmx else "maintenance/run_detail.html"
    return render(request, template, context)
