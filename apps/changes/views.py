"""Change and preset pages: plan → review the diff → apply, with the step log live."""

from __future__ import annotations

import yaml
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from apps.accounts import access
from apps.accounts.audit import Actor
from apps.accounts.models import Role
from apps.accounts.permissions import has_role, teams_where
from apps.changes import presets, protocol, rollouts
from apps.changes.app_forms import DeleteApplicationForm, NewApplicationForm
from apps.changes.filters import ChangeFilter
from apps.changes.forms import PlanForm, PresetForm, RolloutForm
from apps.changes.models import Change, ChangeState, Preset, Rollout
from apps.clusters.models import Cluster
from apps.core.jobs import unclaimed_for
from apps.core.redaction import redact_config
from apps.fleet.configs import unified_diff
from apps.fleet.models import ConfigRevision


def _change(request, pk: int, needed: Role = Role.VIEWER) -> Change:
    return access.get_for(request.user, Change.objects.select_related("cluster__team", "preset"), needed, pk=pk)


@login_required
def change_list(request):
    changes = access.visible(request.user, Change).select_related("cluster", "created_by")
    changes = ChangeFilter(request.GET or None, queryset=changes).qs
    page = Paginator(changes.order_by("-created_at", "-id"), 50).get_page(request.GET.get("page"))
    return render(request, "changes/change_list.html", {"page": page})


@login_required
def plan(request, cluster_pk: int):
    cluster = access.get_for(request.user, Cluster.objects.select_related("team"), Role.OPERATOR, pk=cluster_pk)
    # "Plan this fix" links arrive with the targets, options and reason filled in.
    initial = {
        "targets": request.GET.getlist("target"),
        "options_text": request.GET.get("options", ""),
        "reason": request.GET.get("reason", ""),
    }
    form = PlanForm(request.POST or None, cluster=cluster, user=request.user, initial=initial)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            change = protocol.plan_change(
                Actor.from_request(request),
                cluster,
                targets=form.target_list,
                reason=data["reason"],
                options=data["options_text"],
                preset=data["preset"],
            )
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            return redirect("changes:detail", pk=change.pk)
    return render(request, "changes/plan.html", {"form": form, "cluster": cluster})


@login_required
def deploy_application(request, cluster_pk: int):
    cluster = access.get_for(request.user, Cluster.objects.select_related("team"), Role.OPERATOR, pk=cluster_pk)
    form = NewApplicationForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            change = protocol.plan_create_app(
                Actor.from_request(request), cluster, app=form.application, reason=form.cleaned_data["reason"]
            )
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            return redirect("changes:detail", pk=change.pk)
    return render(
        request,
        "changes/application_form.html",
        {"form": form, "cluster": cluster, "title": "Deploy an application", "button": "Plan and show the diff"},
    )


@login_required
def delete_application(request, cluster_pk: int):
    cluster = access.get_for(request.user, Cluster.objects.select_related("team"), Role.OPERATOR, pk=cluster_pk)
    form = DeleteApplicationForm(
        request.POST or None, cluster=cluster, initial={"application": request.GET.get("application", "")}
    )
    if request.method == "POST" and form.is_valid():
        try:
            change = protocol.plan_delete_app(
                Actor.from_request(request),
                cluster,
                application=form.cleaned_data["application"],
                reason=form.cleaned_data["reason"],
            )
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            return redirect("changes:detail", pk=change.pk)
    return render(
        request,
        "changes/application_form.html",
        {"form": form, "cluster": cluster, "title": "Delete an application", "button": "Plan and show what goes"},
    )


@login_required
def detail(request, pk: int):
    change = _change(request, pk)
    context = {
        "change": change,
        "diff": unified_diff(
            redact_config(change.base_config),
            redact_config(change.new_config),
            old_label="live at planning",
            new_label="planned",
        ),
        "can_operate": has_role(request.user, change.cluster.team, Role.OPERATOR),
        "waiting_s": unclaimed_for(change.heartbeat_at) if change.state == ChangeState.QUEUED else None,
        "resend_s": settings.FLEETDECK_CHANGE_STALE_S,
    }
    template = "changes/partials/progress.html" if request.htmx else "changes/change_detail.html"
    return render(request, template, context)


@login_required
@require_POST
def change_action(request, pk: int, action: str):
    """Apply, cancel or roll back: each is one protocol call; refusals come back as messages."""
    operations = {"apply": protocol.request_apply, "cancel": protocol.cancel, "rollback": protocol.roll_back_change}
    if action not in operations:
        raise Http404("No such action.")
    change = _change(request, pk, Role.OPERATOR)
    extra = {"confirm": request.POST.get("confirm", "")} if action == "apply" else {}
    try:
        result = operations[action](Actor.from_request(request), change, **extra)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
        result = change
    return redirect("changes:detail", pk=result.pk)


@login_required
def preset_list(request):
    items = access.visible(request.user, Preset).select_related("team")
    for preset in items:
        preset.options_yaml = yaml.safe_dump(redact_config(preset.options), sort_keys=False)
    return render(
        request,
        "changes/preset_list.html",
        {"presets": items, "can_create": teams_where(request.user, Role.OPERATOR).exists()},
    )


def _preset_form_view(request, preset: Preset | None):
    teams = teams_where(request.user, Role.OPERATOR)
    if not teams.exists():
        raise PermissionDenied("Only operators and admins manage presets.")
    form = PresetForm(request.POST or None, instance=preset, teams=teams)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        actor = Actor.from_request(request)
        try:
            if preset is None:
                presets.create_preset(
                    actor,
                    team=data["team"],
                    name=data["name"],
                    description=data["description"],
                    options=data["options_text"],
                )
            else:
                presets.update_preset(
                    actor,
                    preset,
                    name=data["name"],
                    description=data["description"],
                    options=data["options_text"],
                    team=data["team"],
                )
        except ValidationError as exc:
            form.add_error("options_text", exc)
        else:
            return redirect("changes:presets")
    return render(request, "changes/preset_form.html", {"form": form, "preset": preset})


@login_required
def preset_create(request):
    return _preset_form_view(request, None)


@login_required
def preset_edit(request, pk: int):
    preset = access.get_for(request.user, Preset.objects.filter(builtin=False), Role.OPERATOR, pk=pk)
    return _preset_form_view(request, preset)


@login_required
@require_POST
def preset_clone(request, pk: int):
    source = access.get_visible_or_404(request.user, Preset, pk=pk)
    team = teams_where(request.user, Role.OPERATOR).first()
    if team is None:
        raise PermissionDenied("Only operators and admins manage presets.")
    clone = presets.clone_preset(Actor.from_request(request), source, team=team)
    return redirect("changes:preset_edit", pk=clone.pk)


@login_required
@require_POST
def preset_delete(request, pk: int):
    preset = access.get_for(request.user, Preset.objects.filter(builtin=False), Role.OPERATOR, pk=pk)
    presets.delete_preset(Actor.from_request(request), preset)
    messages.success(request, f"Deleted preset {preset.name}.")
    return redirect("changes:presets")


@login_required
def rollout_list(request):
    page = Paginator(access.visible(request.user, Rollout).order_by("-created_at", "-id"), 50).get_page(
        request.GET.get("page")
    )
    return render(request, "changes/rollout_list.html", {"page": page, "can_plan": rollouts.may_plan(request.user)})


@login_required
def rollout_create(request):
    rollouts.require_may_plan(request.user)
    form = RolloutForm(request.POST or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            rollout = rollouts.plan_rollout(
                Actor.from_request(request),
                selection=form.selection,
                reason=data["reason"],
                preset=data["preset"],
                options=data["options_text"],
                canary=data["canary"] or None,
                client_error_budget=None
                if data["client_error_budget_pct"] is None
                else data["client_error_budget_pct"] / 100,
            )
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            return redirect("changes:rollout", pk=rollout.pk)
    return render(request, "changes/rollout_form.html", {"form": form})


@login_required
def rollout_detail(request, pk: int):
    rollout = access.get_visible_or_404(request.user, rollouts.seen_by(request.user, Rollout.objects.all()), pk=pk)
    can_run = rollouts.may_run(request.user, rollout)
    hidden = rollout.change_total - len(rollout.changes.all())
    template = "changes/partials/rollout_progress.html" if request.htmx else "changes/rollout_detail.html"
    return render(
        request,
        template,
        {"rollout": rollout, "can_run": can_run, "hidden": hidden, "error": rollouts.error_seen_by(rollout)},
    )


@login_required
@require_POST
def rollout_action(request, pk: int, action: str):
    operations = {"start": rollouts.start, "cancel": rollouts.cancel}
    if action not in operations:
        raise Http404("No such action.")
    rollout = access.get_visible_or_404(request.user, Rollout, pk=pk)
    rollouts.require_may_run(request.user, rollout)
    try:
        operations[action](Actor.from_request(request), rollout)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    return redirect("changes:rollout", pk=rollout.pk)


@login_required
@require_POST
def restore_revision(request, pk: int):
    revision = access.get_for(
        request.user, ConfigRevision.objects.select_related("application", "cluster__team"), Role.OPERATOR, pk=pk
    )
    reason = (
        request.POST.get("reason", "").strip()
        or f"Restore {revision.application.name} to revision {revision.config_hash[:12]}"
    )
    try:
        change = protocol.plan_restore(
            Actor.from_request(request),
            revision.cluster,
            app_configs={revision.application.name: revision.config["submitted"]},
            reason=reason,
        )
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
        return redirect("fleet:revision", pk=revision.pk)
    return redirect("changes:detail", pk=change.pk)
