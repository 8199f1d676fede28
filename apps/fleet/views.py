"""Fleet pages. Each page's live part is the same URL rendered as a fragment for htmx."""

from __future__ import annotations

from typing import cast

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Prefetch
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from apps.accounts import access
from apps.accounts.audit import Actor
from apps.accounts.models import Role
from apps.accounts.permissions import has_role, teams_where, visible_teams
from apps.clusters.filters import ClusterFilter
from apps.clusters.models import Cluster
from apps.fleet import llm, request_sizes
from apps.fleet.forms import LLMPlanInputsForm, SizeMetricForm
from apps.fleet.history import previous_revision, revision_diff
from apps.fleet.models import Application, ConfigRevision, Deployment
from apps.fleet.scaling_history import scaling_series
from apps.fleet.selectors import cluster_listing
from apps.incidents import selectors as incident_selectors

PAGE_SIZE = 50


def _refresh() -> int:
    return settings.FLEETDECK_UI_REFRESH_S


@login_required
def overview(request):
    clusters = cluster_listing(request.user)
    filterset = ClusterFilter(request.GET or None, queryset=clusters)
    # django-filter drops a filter it cannot clean: list nothing rather than clusters it did not ask for.
    listed = clusters.none() if filterset.errors else filterset.qs
    page = Paginator(listed, PAGE_SIZE).get_page(request.GET.get("page"))
    incident_selectors.mark_open_incidents(page.object_list)
    context = {
        "filter": filterset,
        "page": page,
        "teams": visible_teams(request.user),
        "has_clusters": clusters.exists() if not page.object_list else True,
        "can_register": teams_where(request.user, Role.ADMIN).exists(),
        "refresh_s": _refresh(),
        "query": request.GET.urlencode(),
    }
    template = "fleet/partials/cluster_rows.html" if request.htmx else "fleet/overview.html"
    return render(request, template, context)


def _visible_cluster(request, pk: int) -> Cluster:
    return get_object_or_404(cluster_listing(request.user), pk=pk)


def _cluster_context(request, cluster: Cluster) -> dict:
    applications = (
        Application.objects.filter(cluster=cluster, removed_at__isnull=True)
        .prefetch_related(Prefetch("deployments", queryset=Deployment.objects.filter(removed_at__isnull=True)))
        .order_by("name")
    )
    for app in applications:
        app.llm_models = llm.application_models(app, list(app.deployments.all()))
    return {
        "cluster": cluster,
        "applications": applications,
        "removed_applications": Application.objects.filter(cluster=cluster, removed_at__isnull=False).order_by("name"),
        "events": cluster.events.all()[:10],
        "open_incidents": cluster.incidents.exclude(status="resolved")[:10],
        "can_admin": has_role(request.user, cluster.team, Role.ADMIN),
        "can_operate": has_role(request.user, cluster.team, Role.OPERATOR),
        "refresh_s": _refresh(),
    }


@login_required
def cluster_detail(request, pk: int):
    cluster = _visible_cluster(request, pk)
    return render(request, "fleet/cluster_detail.html", _cluster_context(request, cluster))


@login_required
def cluster_status(request, pk: int):
    """The live part of the cluster page: health, sync state, applications and deployments."""
    cluster = _visible_cluster(request, pk)
    return render(request, "fleet/partials/cluster_status.html", _cluster_context(request, cluster))


@login_required
def deployment_detail(request, pk: int):
    deployment = access.get_visible_or_404(
        request.user, Deployment.objects.select_related("application__cluster__team"), pk=pk
    )
    context = {
        "deployment": deployment,
        "application": deployment.application,
        "cluster": deployment.application.cluster,
        "refresh_s": _refresh(),
        "schedule": getattr(deployment, "recycle_schedule", None),
        "runs": deployment.maintenance_runs.all()[:10],
        "incidents": deployment.incidents.all()[:10],
        "findings": deployment.findings.filter(resolved_at__isnull=True, muted_at__isnull=True),
        "scaling": scaling_series(deployment),
        "can_operate": has_role(request.user, deployment.application.cluster.team, Role.OPERATOR),
        "llm": llm.describe(deployment),
    }
    template = "fleet/partials/deployment_live.html" if request.htmx else "fleet/deployment_detail.html"
    return render(request, template, context)


@login_required
def application_history(request, pk: int):
    application = access.get_visible_or_404(request.user, Application.objects.select_related("cluster"), pk=pk)
    page = Paginator(application.revisions.all(), 20).get_page(request.GET.get("page"))
    return render(request, "fleet/application_history.html", {"application": application, "page": page})


@login_required
def revision_detail(request, pk: int):
    revision = access.get_visible_or_404(
        request.user, ConfigRevision.objects.select_related("application__cluster", "cluster__team"), pk=pk
    )
    against_id = request.GET.get("against")
    old = None
    if against_id and against_id.isdigit():
        old = ConfigRevision.objects.filter(pk=int(against_id), application_id=revision.application_id).first()
    if old is None:
        old = previous_revision(revision)
    context = {
        "revision": revision,
        "previous": old,
        "application": revision.application,
        "diff": revision_diff(old, revision),
        "others": revision.application.revisions.exclude(pk=revision.pk)[:50],
        "can_operate": has_role(request.user, revision.cluster.team, Role.OPERATOR),
    }
    return render(request, "fleet/revision_detail.html", context)


@login_required
@require_POST
def llm_plan_inputs(request, pk: int):
    """Store the GPU memory and model config that the LLM memory plan needs and Fleetdeck cannot know."""
    deployment = access.get_visible_or_404(
        request.user, Deployment.objects.select_related("application__cluster__team"), pk=pk
    )
    access.demand(request.user, deployment.application.cluster.team, llm.SET_PLAN_INPUTS)
    form = LLMPlanInputsForm(request.POST)
    if form.is_valid():
        try:
            llm.set_plan_inputs(
                Actor.from_request(request),
                deployment,
                gpu_memory_gib=form.cleaned_data["gpu_memory_gib"],
                model_config=form.cleaned_data["model_config"],
            )
        except ValueError as exc:
            messages.error(request, str(exc))
        else:
            messages.success(request, "Saved: the memory plan uses what you gave.")
    else:
        messages.error(request, " ".join(e for errors in form.errors.values() for e in errors))
    return redirect("fleet:deployment", pk=deployment.pk)


@login_required
@require_POST
def size_metric(request, pk: int):
    """Name the histogram of the deployment's request sizes (or forget it, with an empty name)."""
    deployment = cast(
        Deployment,
        access.get_visible_or_404(request.user, Deployment.objects.select_related("application__cluster__team"), pk=pk),
    )
    access.demand(request.user, deployment.application.cluster.team, request_sizes.SET_SIZE_METRIC)
    form = SizeMetricForm(request.POST)
    if form.is_valid():
        try:
            request_sizes.set_size_metric(
                Actor.from_request(request),
                deployment,
                metric=form.cleaned_data["metric"],
                unit=form.cleaned_data["unit"],
            )
        except ValueError as exc:
            messages.error(request, str(exc))
        else:
            messages.success(
                request,
                f"Saved: the next metrics readings count {deployment.size_metric}."
                if deployment.size_metric
                else "Forgotten: no histogram of request sizes is read for this deployment.",
            )
    else:
        messages.error(request, " ".join(str(e) for errors in form.errors.values() for e in errors))
    return redirect("fleet:deployment", pk=deployment.pk)
