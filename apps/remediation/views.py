from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from urllib.parse import urlencode

import orjson
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.db.models import Count
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from apps.accounts import access
from apps.accounts.audit import Actor
from apps.accounts.models import Role
from apps.accounts.permissions import has_role, teams_where
from apps.calibration import inputs as calibration_inputs
from apps.core import links
from apps.fleet.templatetags.fleet_tags import human
from apps.incidents.models import Incident
from apps.remediation import findings, remedy_checks, verification, wizards
from apps.remediation.filters import FindingFilter
from apps.remediation.models import Finding, Wizard
from apps.remediation.presentation import wizard_context
from apps.remediation.rules import BY_ID
from apps.scaler import wizard_step
from controlplane.api.rows import narrow


def fix_url(finding: Finding, plan: Callable[[int], str] | None = None, options: str | None = None) -> str:
    """Where "plan this fix" leads: the change planner prefilled, or the schedule/warmup page.
    `plan`: the planner's link by cluster, and `options` the patch as YAML, for a page of findings."""
    if finding.patch and finding.deployment_name:
        query = urlencode(
            {
                "target": f"{finding.application_name}/{finding.deployment_name}",
                "options": findings.patch_text(finding) if options is None else options,
                "reason": f"Finding: {BY_ID[finding.rule].title}",
            }
        )
        return f"{(plan or links.by_key('changes:plan'))(finding.cluster_id)}?{query}"
    if finding.action == "schedule" and finding.deployment_id:
        return reverse("maintenance:schedule", args=[finding.deployment_id])
    if finding.action == "warmup" and finding.deployment_id:
        return reverse("maintenance:warmups", args=[finding.deployment.application_id])
    return ""


# The fleet page shows this many places per rule; "show all" pages through one rule.
FINDINGS_PER_GROUP = 25
FINDINGS_PER_PAGE = 100
FINDING_ORDER = ("cluster_name", "application_name", "deployment_name", "pk")


@login_required
def finding_list(request):
    # Open findings only; the page's `muted=1` shows muted ones as well as the rest.
    show_muted = request.GET.get("muted") == "1"
    queryset = FindingFilter(
        {"open": "true"} if show_muted else {"open": "true", "muted": "false"},
        queryset=access.visible(request.user, Finding).select_related("cluster", "deployment"),
    ).qs
    # A row shows its cluster's name and links its deployment: not the deployment's configs.
    queryset = narrow(queryset, "cluster__name", "cluster__team", "deployment__application")
    counts = dict(queryset.order_by().values_list("rule").annotate(n=Count("pk")))
    only = request.GET.get("rule")
    page = None
    if only in counts:
        page = Paginator(queryset.filter(rule=only).order_by(*FINDING_ORDER), FINDINGS_PER_PAGE).get_page(
            request.GET.get("page")
        )
        rows = list(page.object_list)
    else:
        only = None
        first = findings.first_places(queryset, list(counts), FINDING_ORDER, FINDINGS_PER_GROUP)
        rows = list(queryset.filter(pk__in=first).order_by(*FINDING_ORDER))
    # Roles once per page, not a team and a membership query per finding.
    operable = set(teams_where(request.user, Role.OPERATOR).values_list("pk", flat=True))
    by_rule = defaultdict(list)
    plan, cluster_url, deployment_url, mute_url = (
        links.by_key(name) for name in ("changes:plan", "fleet:cluster", "fleet:deployment", "remediation:mute")
    )
    # A patch is written twice a row (the planner's YAML, the row's flow YAML), and the findings of
    # a rule mostly propose the same one: each distinct patch is written once a page.
    written: dict[bytes, tuple[str, str]] = {}
    for finding in rows:
        key = orjson.dumps(finding.patch)
        if key not in written:
            written[key] = (findings.patch_text(finding), human(finding.patch, "yaml") if finding.patch else "")
        options, finding.patch_yaml = written[key]
        finding.fix_url = fix_url(finding, plan, options)
        finding.cluster_url = cluster_url(finding.cluster_id)
        finding.deployment_url = deployment_url(finding.deployment_id) if finding.deployment_id else ""
        finding.mute_url = mute_url(finding.pk)
        finding.can_operate = finding.cluster.team_id in operable
        by_rule[finding.rule].append(finding)
    groups = [
        {"rule": BY_ID[rule], "findings": items, "count": counts[rule], "hidden": counts[rule] - len(items)}
        for rule, items in sorted(by_rule.items(), key=lambda kv: (-counts[kv[0]], kv[0]))
    ]
    context = {"groups": groups, "show_muted": show_muted, "only": only, "page": page}
    # The same for every row: reversed once, not once per finding.
    context["wizard_start_url"] = reverse("remediation:wizard_start")
    return render(request, "remediation/findings.html", context)


@login_required
@require_POST
def finding_mute(request, pk: int):
    finding = access.get_visible_or_404(request.user, Finding.objects.select_related("cluster__team"), pk=pk)
    access.demand(request.user, finding.cluster.team, findings.UNMUTE if finding.muted_at else findings.MUTE)
    try:
        if finding.muted_at:
            findings.unmute(Actor.from_request(request), finding)
        else:
            findings.mute(Actor.from_request(request), finding, request.POST.get("reason", ""))
    except ValueError as exc:
        messages.error(request, str(exc))
    return redirect("remediation:findings")


# --- wizards -------------------------------------------------------------------------------


def _wizards(request):
    return access.visible(request.user, Wizard).select_related("cluster", "incident", "deployment")


@login_required
def wizard_list(request):
    # A row names its cluster and its source: not the incident's evidence or the deployment's configs.
    wizards = narrow(access.visible(request.user, Wizard).select_related("cluster"), "cluster__name")
    active = wizards.filter(state__in=[Wizard.State.OPEN, Wizard.State.VERIFYING]).order_by("-updated_at")
    page = Paginator(wizards.exclude(pk__in=active).order_by("-updated_at", "-id"), 50).get_page(
        request.GET.get("page")
    )
    return render(request, "remediation/wizard_list.html", {"active": active, "page": page})


@login_required
@require_POST
def wizard_start(request):
    incident = finding = None
    if request.POST.get("incident"):
        incident = access.get_visible_or_404(
            request.user, Incident.objects.select_related("cluster__team"), pk=request.POST["incident"]
        )
    elif request.POST.get("finding"):
        finding = access.get_visible_or_404(
            request.user, Finding.objects.select_related("cluster__team"), pk=request.POST["finding"]
        )
    source = incident or finding
    if source is None:
        raise Http404("Start a wizard from an incident or a finding.")
    access.demand(request.user, source.cluster.team, wizards.START)
    try:
        wizard, created = wizards.start(Actor.from_request(request), incident=incident, finding=finding)
    except wizards.WizardError as exc:
        messages.error(request, " ".join(exc.messages))
        return redirect("incidents:detail", pk=incident.pk) if incident else redirect("remediation:findings")
    if not created:
        messages.info(request, f"Wizard #{wizard.pk} was already open for this deployment: you joined it.")
    return redirect("remediation:wizard", pk=wizard.pk)


@login_required
def wizard_detail(request, pk: int):
    wizard = get_object_or_404(_wizards(request), pk=pk)
    return _render_wizard(request, wizard, request.GET.get("step"))


def _render_wizard(request, wizard: Wizard, position, error: str = ""):
    context = wizard_context(wizard, position, can_operate=has_role(request.user, wizard.cluster.team, Role.OPERATOR))
    context["error"] = error
    template = "remediation/partials/wizard.html" if request.htmx else "remediation/wizard.html"
    return render(request, template, context)


ACTIONS = {
    "apply": lambda actor, w, post, rev: wizards.apply(actor, w, [int(p) for p in post.getlist("steps")], revision=rev),
    "skip": lambda actor, w, post, rev: wizards.skip(
        actor, w, int(post["step"]), reason=post.get("reason", ""), revision=rev
    ),
    "confirm": lambda actor, w, post, rev: wizards.confirm(
        actor, w, int(post["step"]), note=post.get("note", ""), revision=rev
    ),
    "check": lambda actor, w, post, rev: remedy_checks.run(
        actor,
        w,
        int(post["step"]),
        revision=rev,
        params={k: post[k] for k in ("method", "path", "field", "size") if post.get(k)},
    ),
    "scaler": lambda actor, w, post, rev: wizard_step.take(actor, w, int(post["step"]), revision=rev),
    "replan": lambda actor, w, post, rev: wizards.replan(actor, w, revision=rev),
    "objectives": lambda actor, w, post, rev: wizards.set_objectives(actor, w, revision=rev, **_objectives(post)),
    "calibrate": lambda actor, w, post, rev: wizards.calibrate(
        actor, w, request=_representative(post), mix=_mix(post), revision=rev
    ),
    "verify": lambda actor, w, post, rev: verification.start(
        actor, w, window_s=int(post.get("window_s") or 0) or None, revision=rev
    ),
    "evaluate": lambda actor, w, post, rev: verification.evaluate(w.pk),
    "abandon": lambda actor, w, post, rev: wizards.abandon(actor, w, reason=post.get("reason", ""), revision=rev),
}


def _objectives(post) -> dict:
    """The objectives form: a p99 in ms and a failed share in percent, each checked like the API's fields."""
    latency = int(post["latency_objective_ms"])
    failure = float(post["failure_percent"])
    if not 100 <= latency <= 600_000:
        raise ValidationError({"latency_objective_ms": "The p99 objective is between 100 ms and 600,000 ms."})
    if not 0 <= failure <= 100:
        raise ValidationError({"failure_objective": "The failed share is between 0 % and 100 %."})
    asked = float(post["margin_percent"]) if post.get("margin_percent") else None
    if asked is not None and not 0 <= asked <= 90:
        raise ValidationError({"margin": "The margin is between 0 % and 90 % of the room below Ray's kill level."})
    return {
        "latency_objective_ms": latency,
        "failure_objective": failure / 100,
        "margin_fraction": asked / 100 if asked is not None else None,
        "confirmation": post.get("confirm_less_margin", ""),
    }


def _mix(post):
    """The calibration form's mix: JSON, "warmup" for the warmup profiles, or None when empty."""
    text = post.get("mix", "").strip()
    if not text or text in (calibration_inputs.WARMUP_MIX, calibration_inputs.OBSERVED_MIX):
        return text or None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationError(f"mix: not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno}).") from exc


def _representative(post) -> dict | None:
    """The calibration form's request; an empty form means Fleetdeck's default for the deployment."""
    fields = {k: post[k].strip() for k in ("method", "path", "query", "body") if post.get(k, "").strip()}
    if not fields:
        return None
    if post.get("content_type", "").strip():
        fields["headers"] = {"content-type": post["content_type"].strip()}
    return {"kind": "http", **fields}


@login_required
@require_POST
def wizard_action(request, pk: int, action: str):
    wizard = get_object_or_404(_wizards(request), pk=pk)
    if action not in ACTIONS:
        raise Http404("No such wizard action.")
    access.demand(request.user, wizard.cluster.team, wizards.OPERATIONS[action])
    error = ""
    try:
        revision = int(request.POST["revision"]) if request.POST.get("revision") else None
        ACTIONS[action](Actor.from_request(request), wizard, request.POST, revision)
    except (ValueError, KeyError):
        error = "The form was incomplete: reload the page and try again."
    except ValidationError as exc:
        error = " ".join(exc.messages)
    wizard.refresh_from_db()
    if not request.htmx:
        if error:
            messages.error(request, error)
        return redirect(f"{reverse('remediation:wizard', args=[pk])}?step={request.POST.get('step', '')}")
    return _render_wizard(request, wizard, request.POST.get("step"), error)
