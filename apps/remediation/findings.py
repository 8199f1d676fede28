"""Recomputing findings after each sync; muting them."""

from __future__ import annotations

import statistics

import yaml
from django.db import transaction
from django.utils import timezone

from apps.accounts.audit import Actor, record
from apps.clusters.models import Cluster
from apps.fleet.models import Deployment
from apps.remediation import rules
from apps.remediation.models import Finding


def cold_start_ratio(points: list[dict]) -> tuple[bool, float | None]:
    starts = [i for i, p in enumerate(points) if (p.get("starts") or 0) > 0]
    if not starts:
        return False, None
    steady = [p["p50"] for p in points if p.get("p50") and not p.get("starts")]
    after = [points[i + 1]["p99"] for i in starts if i + 1 < len(points) and points[i + 1].get("p99")]
    if not steady or not after:
        return True, None
    return True, max(after) / statistics.median(steady)


def subjects(cluster: Cluster) -> list[tuple[Deployment, rules.Subject]]:
    from apps.incidents.models import Incident, SignalWindow
    from apps.maintenance.models import RecycleSchedule, WarmupProfile

    deployments = list(Deployment.objects.filter(application__cluster=cluster, removed_at__isnull=True, application__removed_at__isnull=True)
                       .select_related("application"))
    scheduled = set(RecycleSchedule.objects.filter(deployment__in=deployments, enabled=True).values_list("deployment_id", flat=True))
    warmed = set(WarmupProfile.objects.filter(application__cluster=cluster, enabled=True).values_list("application__name", flat=True))
    windows = {(w.application_name, w.deployment_name): w.points for w in SignalWindow.objects.filter(cluster=cluster)}
    ratchet = Incident.objects.filter(cluster=cluster, kind=Incident.Kind.MEMORY_RATCHET).exclude(status="resolved").exists()
    out = []
    for dep in deployments:
        cold, ratio = cold_start_ratio(windows.get((dep.application.name, dep.name), []))
        out.append((dep, rules.Subject(
            cluster_name=cluster.name, ray_version=cluster.ray_version, application=dep.application.name, deployment=dep.name,
            effective=dep.effective_config, submitted=dep.submitted_config, running_replicas=dep.running_replicas,
            has_recycle_schedule=dep.pk in scheduled, has_warmup=dep.application.name in warmed,
            cold_starts_observed=cold, cold_start_ratio=ratio, memory_ratchet=ratchet,
        )))
    return out


def recompute(cluster_id: int) -> dict:
    """Open findings for rules that fire, resolve those that stopped. Unchanged findings cost no write."""
    cluster = Cluster.objects.filter(pk=cluster_id).first()
    if cluster is None:
        return {}
    hits: dict[tuple[str, str, str], tuple[Deployment | None, rules.Hit]] = {}
    for dep, subject in subjects(cluster):
        for hit in rules.evaluate(subject):
            hits[(subject.application, subject.deployment, hit.rule)] = (dep, hit)
    for hit in rules.cluster_hits(cluster.auth_mode):
        hits[("", "", hit.rule)] = (None, hit)
    now = timezone.now()
    opened = resolved = 0
    with transaction.atomic():
        current = {(f.application_name, f.deployment_name, f.rule): f for f in Finding.objects.filter(cluster=cluster, resolved_at__isnull=True)}
        for key, (dep, hit) in hits.items():
            finding = current.get(key)
            if finding is None:
                Finding.objects.create(cluster=cluster, deployment=dep, application_name=key[0], deployment_name=key[1], rule=hit.rule,
                                       severity=hit.severity, evidence=hit.evidence, patch=hit.patch, action=hit.action)
                opened += 1
            elif (finding.evidence, finding.patch, finding.severity) != (hit.evidence, hit.patch, hit.severity):
                Finding.objects.filter(pk=finding.pk).update(evidence=hit.evidence, patch=hit.patch, severity=hit.severity)
        gone = [f.pk for key, f in current.items() if key not in hits]
        if gone:
            resolved = Finding.objects.filter(pk__in=gone).update(resolved_at=now)
    return {"opened": opened, "resolved": resolved}


def mute(actor: Actor, finding: Finding, reason: str) -> Finding:
    if not reason.strip():
        raise ValueError("Say why this finding is muted.")
    finding.muted_at, finding.muted_by, finding.mute_reason = timezone.now(), actor.user, reason.strip()[:2000]
    finding.save(update_fields=["muted_at", "muted_by", "mute_reason"])
    record(actor, "finding.mute", finding, team=finding.cluster.team, changes={"rule": finding.rule, "reason": finding.mute_reason})
    return finding


def unmute(actor: Actor, finding: Finding) -> Finding:
    finding.muted_at, finding.muted_by, finding.mute_reason = None, None, ""
    finding.save(update_fields=["muted_at", "muted_by", "mute_reason"])
    record(actor, "finding.unmute", finding, team=finding.cluster.team, changes={"rule": finding.rule})
    return finding


def patch_text(finding: Finding) -> str:
    return yaml.safe_dump(finding.patch, sort_keys=False) if finding.patch else ""
