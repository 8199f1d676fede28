"""Cluster registry pages. Every write is a service call; these only translate HTTP."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from apps.accounts import access
from apps.accounts.audit import Actor
from apps.accounts.models import Role
from apps.accounts.permissions import teams_where
from apps.clusters import services
from apps.clusters.forms import ClusterForm
from apps.clusters.models import EDITABLE_FIELDS, UPDATABLE_FIELDS, Cluster


def _cluster(request, pk: int, needed: Role) -> Cluster:
    return access.get_for(request.user, Cluster.objects.select_related("team"), needed, pk=pk)


def _form_error(form: ClusterForm, exc: ValidationError) -> None:
    field = "token" if exc.code in ("RayAuthRefused", "TokenNeeded") else "dashboard_url"
    form.add_error(field, exc)


@login_required
def cluster_create(request):
    if not teams_where(request.user, Role.ADMIN).exists():
        raise PermissionDenied("Only team admins register clusters.")
    form = ClusterForm(request.POST or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            cluster = services.register_cluster(
                Actor.from_request(request), **{field: data[field] for field in EDITABLE_FIELDS}
            )
        except ValidationError as exc:
            _form_error(form, exc)
        else:
            messages.success(request, f"Registered {cluster.name} (Ray {cluster.ray_version}); first sync queued.")
            return redirect("fleet:cluster", pk=cluster.pk)
    return render(request, "clusters/cluster_form.html", {"form": form, "creating": True})


@login_required
def cluster_edit(request, pk: int):
    cluster = _cluster(request, pk, Role.ADMIN)
    form = ClusterForm(request.POST or None, user=request.user, instance=cluster)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        changes = {field: data[field] for field in UPDATABLE_FIELDS if field != "token"}
        if data.get("clear_token"):
            changes["token"] = ""
        elif data["token"]:
            changes["token"] = data["token"]
        try:
            services.update_cluster(Actor.from_request(request), cluster, **changes)
        except ValidationError as exc:
            _form_error(form, exc)
        else:
            messages.success(request, f"Saved {cluster.name}.")
            return redirect("fleet:cluster", pk=cluster.pk)
    return render(request, "clusters/cluster_form.html", {"form": form, "cluster": cluster, "creating": False})


@login_required
def cluster_delete(request, pk: int):
    cluster = _cluster(request, pk, Role.ADMIN)
    if request.method == "POST":
        name = cluster.name
        services.delete_cluster(Actor.from_request(request), cluster)
        messages.success(request, f"Deleted {name} from Fleetdeck. Nothing was changed on the Ray cluster.")
        return redirect("fleet:overview")
    return render(request, "clusters/cluster_confirm_delete.html", {"cluster": cluster})


@login_required
@require_POST
def cluster_sync(request, pk: int):
    cluster = access.get_visible_or_404(request.user, Cluster.objects.select_related("team"), pk=pk)
    access.demand(request.user, cluster.team, services.SYNC)
    services.request_sync(Actor.from_request(request), cluster)
    if request.htmx:
        return redirect("fleet:cluster_status", pk=cluster.pk)
    messages.info(request, f"Sync of {cluster.name} queued.")
    return redirect("fleet:cluster", pk=cluster.pk)
