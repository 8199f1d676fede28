from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from apps.accounts import access
from apps.accounts.audit import Actor
from apps.accounts.models import Role
from apps.accounts.permissions import has_role
from apps.incidents import services
from apps.incidents.filters import IncidentFilter
from apps.incidents.models import Incident


def _visible(request):
    return access.visible(request.user, Incident).select_related("cluster")


@login_required
def incident_list(request):
    filterset = IncidentFilter(request.GET or None, queryset=_visible(request).order_by("-last_signal_at", "-id"))
    page = Paginator(filterset.qs, 50).get_page(request.GET.get("page"))
    return render(request, "incidents/list.html", {"page": page, "filter": filterset, "query": request.GET.urlencode()})


@login_required
def incident_detail(request, pk: int):
    incident = get_object_or_404(_visible(request).prefetch_related("oom_kills", "pod_kills", "timeline__author"), pk=pk)
    context = {
        "incident": incident,
        "can_operate": has_role(request.user, incident.cluster.team, Role.OPERATOR),
        "chart": chart_data(incident),
        "related": services.related_work(incident),
    }
    return render(request, "incidents/detail.html", context)


def chart_data(incident: Incident) -> dict | None:
    """The evidence series for the page's charts, with OOM kills as markers; None without data."""
    node_series = incident.evidence.get("node_series") or []
    if node_series:
        return {
            "t": [point["t"] * 1000 for point in node_series],
            "mem": [point.get("mem") for point in node_series],
            "gpu": [point.get("gpu") for point in node_series],
        }
    series = incident.evidence.get("series") or []
    if not series:
        return None
    times = [point["t"] for point in series]
    kills = [kill.seen_at.timestamp() for kill in incident.oom_kills.all()]
    return {
        "t": [t * 1000 for t in times],
        **{key: [point.get(key) for point in series] for key in ("p50", "p99", "ongoing", "queued", "rps")},
        # Each kill is drawn on the reading nearest to when Fleetdeck saw it.
        "kill_index": sorted({min(range(len(times)), key=lambda i: abs(times[i] - kill)) for kill in kills}),
    }


@login_required
@require_POST
def incident_action(request, pk: int, action: str):
    statuses = {"acknowledge": Incident.Status.ACKNOWLEDGED, "resolve": Incident.Status.RESOLVED}
    if action != "note" and action not in statuses:
        raise Http404("No such action.")
    incident = get_object_or_404(_visible(request), pk=pk)
    actor = Actor.from_request(request)
    if action == "note":
        if request.POST.get("text", "").strip():
            services.add_note(actor, incident, request.POST["text"])
        return redirect("incidents:detail", pk=pk)
    access.require(request.user, incident.cluster.team, Role.OPERATOR, "acknowledge or resolve incidents")
    status = statuses[action]
    try:
        services.set_status(actor, incident, status)
    except ValueError as exc:
        messages.error(request, str(exc))
    return redirect("incidents:detail", pk=pk)
