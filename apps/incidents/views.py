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
from apps.incidents import actions
from apps.incidents.charts import chart_data, incident_scaling
from apps.incidents.filters import IncidentFilter
from apps.incidents.models import Incident
from apps.incidents.timeline import related_work


def _visible(request):
    return access.visible(request.user, Incident).select_related("cluster")


@login_required
def incident_list(request):
    filterset = IncidentFilter(request.GET or None, queryset=_visible(request).order_by("-last_signal_at", "-id"))
    page = Paginator(filterset.qs, 50).get_page(request.GET.get("page"))
    return render(request, "incidents/list.html", {"page": page, "filter": filterset, "query": request.GET.urlencode()})


@login_required
def incident_detail(request, pk: int):
    incident = get_object_or_404(
        _visible(request).prefetch_related("oom_kills", "pod_kills", "timeline__author"), pk=pk
    )
    context = {
        "incident": incident,
        "can_operate": has_role(request.user, incident.cluster.team, Role.OPERATOR),
        "chart": chart_data(incident),
        "scaling": incident_scaling(incident),
        "timeline": _timeline(incident),
    }
    return render(request, "incidents/detail.html", context)


def _timeline(incident: Incident) -> list[dict]:
    """The incident's own events among what happened around it, in order."""
    own = [{"at": event.at, "event": event} for event in incident.timeline.all()]
    return sorted(related_work(incident) + own, key=lambda item: item["at"])


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
            actions.add_note(actor, incident, request.POST["text"])
        return redirect("incidents:detail", pk=pk)
    access.demand(request.user, incident.cluster.team, actions.HANDLE)
    status = statuses[action]
    try:
        actions.set_status(actor, incident, status)
    except ValueError as exc:
        messages.error(request, str(exc))
    return redirect("incidents:detail", pk=pk)
