from __future__ import annotations

from collections import defaultdict
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from apps.accounts.audit import Actor
from apps.accounts.models import Role
from apps.accounts.permissions import has_role, visible_teams
from apps.remediation import findings
from apps.remediation.models import Finding
from apps.remediation.rules import BY_ID


def fix_url(finding: Finding) -> str:
    """Where "plan this fix" leads: the change planner prefilled, or the schedule/warmup page."""
    if finding.patch and finding.deployment_name:
        query = urlencode({"target": f"{finding.application_name}/{finding.deployment_name}", "options": findings.patch_text(finding),
                           "reason": f"Finding: {BY_ID[finding.rule].title}"})
        return f"{reverse('changes:plan', args=[finding.cluster_id])}?{query}"
    if finding.action == "schedule" and finding.deployment_id:
        return reverse("maintenance:schedule", args=[finding.deployment_id])
    if finding.action == "warmup" and finding.deployment_id:
        return reverse("maintenance:warmups", args=[finding.deployment.application_id])
    return ""


@login_required
def finding_list(request):
    show_muted = request.GET.get("muted") == "1"
    queryset = (Finding.objects.filter(cluster__team__in=visible_teams(request.user), resolved_at__isnull=True)
                .select_related("cluster", "deployment__application"))
    if not show_muted:
        queryset = queryset.filter(muted_at__isnull=True)
    by_rule = defaultdict(list)
    for finding in queryset.order_by("cluster__name", "application_name", "deployment_name"):
        finding.fix_url = fix_url(finding)
        finding.can_operate = has_role(request.user, finding.cluster.team, Role.OPERATOR)
        by_rule[finding.rule].append(finding)
    groups = [{"rule": BY_ID[rule], "findings": items} for rule, items in sorted(by_rule.items(), key=lambda kv: -len(kv[1]))]
    return render(request, "remediation/findings.html", {"groups": groups, "show_muted": show_muted})


@login_required
@require_POST
def finding_mute(request, pk: int):
    finding = get_object_or_404(Finding.objects.select_related("cluster__team"), pk=pk, cluster__team__in=visible_teams(request.user))
    if not has_role(request.user, finding.cluster.team, Role.OPERATOR):
        raise PermissionDenied("Only operators mute findings.")
    try:
        if finding.muted_at:
            findings.unmute(Actor.from_request(request), finding)
        else:
            findings.mute(Actor.from_request(request), finding, request.POST.get("reason", ""))
    except ValueError as exc:
        messages.error(request, str(exc))
    return redirect("remediation:findings")
