"""The scaler's buttons on the deployment page: start a shadow scaler, hand it the replica count,
give it back to Serve's autoscaler, delete it. Each posts to the service the API calls and comes
back to the deployment page with what happened."""

from __future__ import annotations

from typing import cast

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from apps.accounts import access
from apps.accounts.audit import Actor
from apps.fleet.models import Deployment
from apps.scaler import control, services
from apps.scaler.models import Scaler

ACTIONS = {
    "activate": (control.CONTROL, "Queued change #{change}: the scaler takes the count once it is verified."),
    "deactivate": (control.CONTROL, "Queued change #{change}: Serve's autoscaler gets the count back once verified."),
    "delete": (services.MANAGE, "Scaler deleted."),
}


@login_required
@require_POST
def scaler_create(request, pk: int):
    deployment = cast(
        Deployment, access.get_visible_or_404(request.user, Deployment.objects.select_related("application"), pk=pk)
    )
    access.demand(request.user, deployment.application.cluster.team, services.MANAGE)
    try:
        services.create_shadow_scaler(
            Actor.from_request(request),
            deployment,
            min_replicas=_whole(request.POST.get("min_replicas"), "min_replicas"),
            max_replicas=_whole(request.POST.get("max_replicas"), "max_replicas"),
        )
        messages.success(request, "Shadow scaler started: it records what it would do from the next reading.")
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    return redirect("fleet:deployment", pk=deployment.pk)


@login_required
@require_POST
def scaler_action(request, pk: int, action: str):
    if action not in ACTIONS:
        raise Http404(f"A scaler has no action {action!r}.")
    scaler = cast(
        Scaler, access.get_visible_or_404(request.user, Scaler.objects.select_related("deployment__application"), pk=pk)
    )
    permission, done = ACTIONS[action]
    access.demand(request.user, scaler.deployment.application.cluster.team, permission)
    actor = Actor.from_request(request)
    try:
        if action == "delete":
            services.delete_scaler(actor, scaler)
            messages.success(request, done)
        else:
            change = (control.activate if action == "activate" else control.deactivate)(actor, scaler)
            messages.success(request, done.format(change=change.pk))
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    return redirect("fleet:deployment", pk=scaler.deployment_id)


def _whole(value: str | None, field: str) -> int:
    try:
        return int(value or "")
    except ValueError as exc:
        raise ValidationError(f"{field} must be a whole number.") from exc
