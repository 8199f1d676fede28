"""Recomputing findings after each sync; muting them."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from apps.accounts.access import Permission
from apps.accounts.audit import Actor, record
from apps.accounts.models import Role
from apps.clusters.models import Cluster
from apps.core import yamltext
from apps.fleet import llm, sync
from apps.fleet.models import Deployment
from apps.incidents.models import Incident, SignalWindow
from apps.llm.recognise import LLMModel
from apps.maintenance.models import RecycleSchedule, WarmupProfile
from apps.remediation import rules
from apps.remediation.models import Finding

MUTE = Permission(Role.OPERATOR, "mute findings")
UNMUTE = Permission(Role.OPERATOR, "unmute findings")


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
    deployments = list(
        Deployment.objects.filter(
            application__cluster=cluster, removed_at__isnull=True, application__removed_at__isnull=True
        ).select_related("application__cluster")
    )
    scheduled = set(
        RecycleSchedule.objects.filter(deployment__in=deployments, enabled=True).values_list("deployment_id", flat=True)
    )
    warmed = set(
        WarmupProfile.objects.filter(application__cluster=cluster, enabled=True).values_list(
            "application__name", flat=True
        )
    )
    windows = {(w.application_name, w.deployment_name): w.points for w in SignalWindow.objects.filter(cluster=cluster)}
    ratchet = (
        Incident.objects.filter(cluster=cluster, kind=Incident.Kind.MEMORY_RATCHET).exclude(status="resolved").exists()
    )
    llm_models = _llm_models(deployments)
    out = []
    now_s = time.time()
    for dep in deployments:
        points = windows.get((dep.application.name, dep.name), [])
        model = llm_models.get(dep.pk)
        plan = llm.memory_plan(dep, model)[0] if model and model.engine else None
        ttfts = [p["ttft_p99"] for p in points if p.get("ttft_p99") is not None]
        cold, ratio = cold_start_ratio(points)
        p99s = [p["p99"] for p in points if p.get("p99")]
        out.append(
            (
                dep,
                rules.Subject(
                    cluster_name=cluster.name,
                    ray_version=cluster.ray_version,
                    application=dep.application.name,
                    deployment=dep.name,
                    effective=dep.effective_config,
                    submitted=dep.submitted_config,
                    running_replicas=dep.running_replicas,
                    has_recycle_schedule=dep.pk in scheduled,
                    has_warmup=dep.application.name in warmed,
                    cold_starts_observed=cold,
                    cold_start_ratio=ratio,
                    memory_ratchet=ratchet,
                    required_resources=dep.required_resources,
                    target_replicas=dep.target_replicas,
                    waiting_replicas=dep.waiting_replicas,
                    # Ray's clock against ours: both keep NTP time on any cluster worth watching.
                    waiting_since_s=dep.waiting_since_s,
                    waiting_for_s=max(now_s - dep.waiting_since_s, 0.0) if dep.waiting_since_s else None,
                    waiting_threshold_s=settings.FLEETDECK_WAITING_REPLICA_S,
                    node_resources=cluster.node_resources or None,
                    autoscaling_detail=dep.autoscaling_detail,
                    p99_processing_ms=max(p99s) if p99s else None,
                    llm=model,
                    llm_plan=plan,
                    llm_gpu_memory_gib=dep.llm_gpu_memory_gib,
                    p99_ttft_s=max(ttfts) if ttfts else None,
                ),
            )
        )
    return out


def _llm_models(deployments: list[Deployment]) -> dict[int, LLMModel]:
    """The serve.llm model of each deployment that serves one, by deployment id."""
    by_app: dict[int, list[Deployment]] = {}
    for dep in deployments:
        by_app.setdefault(dep.application_id, []).append(dep)
    out = {}
    for deps in by_app.values():
        models = {m.deployment_name: m for m in llm.application_models(deps[0].application, deps)}
        out |= {dep.pk: models[dep.name] for dep in deps if dep.name in models}
    return out


def on_cluster_synced(sender, cluster_id: int, outcome, **kwargs) -> None:
    # Findings read the deployments, which an unchanged sync leaves as they were, and metric
    # windows, which move when a metrics reading is taken (`on_metrics_collected`); a waiting
    # replica (read by the clock) makes no sync unchanged, and the inputs no dashboard shows
    # (schedules, warmups, LLM inputs, the registration) make the next sync apply in full when they change.
    if not outcome.unchanged:
        recompute(cluster_id)


def on_metrics_collected(sender, cluster_id: int, **kwargs) -> None:
    recompute(cluster_id)


def recompute(cluster_id: int) -> dict:
    """Open findings for rules that fire, resolve those that stopped. Unchanged findings cost no write.
    Owns the config-lint rules only: Kubernetes findings are recomputed by `recompute_kube`."""
    cluster = Cluster.objects.filter(pk=cluster_id).first()
    if cluster is None:
        return {}
    wanted: dict[tuple[str, str, str, str], _Row] = {}
    for dep, subject in subjects(cluster):
        for hit in rules.evaluate(subject):
            wanted[(subject.application, subject.deployment, "", hit.rule)] = _Row.of_hit(dep, hit)
    for hit in rules.cluster_hits(cluster.auth_mode):
        wanted[("", "", "", hit.rule)] = _Row.of_hit(None, hit)
    # Every rule but the Kubernetes checks, so a finding of a rule since retired still resolves.
    return _reconcile(cluster, wanted, owned=~Q(rule__in=rules.KUBE_IDS))


def on_recycle_or_warmup_changed(sender, instance, **kwargs) -> None:
    """Findings read recycle schedules and warmups, which no sync's answers show."""
    if hasattr(instance, "deployment_id"):
        clusters = Cluster.objects.filter(applications__deployments=instance.deployment_id)
    else:
        clusters = Cluster.objects.filter(applications=instance.application_id)
    sync.apply_in_full_next(clusters)


def on_kube_findings_checked(sender, *, cluster: Cluster, findings: list, complete: bool, **kwargs) -> None:
    recompute_kube(cluster, findings, complete=complete)


def recompute_kube(cluster: Cluster, kube_findings: list, *, complete: bool) -> dict:
    """Store the K1-K4 findings of a Kubernetes inspection (`apps.kubernetes.checks.Finding`). Several
    findings of one rule on one subject become one row. When the inspection saw only part of
    the cluster (`complete` false), findings it did not see again stay open rather than resolve."""
    wanted: dict[tuple[str, str, str, str], _Row] = {}
    for found in kube_findings:
        key = ("", "", found.subject[:300], found.rule)
        evidence = {**found.evidence, "cause": found.cause} if found.cause else dict(found.evidence)
        row = _Row(None, found.severity, evidence, None, "", found.message)
        wanted[key] = wanted[key].merged(row) if key in wanted else row
    return _reconcile(cluster, wanted, owned=Q(rule__in=rules.KUBE_IDS), resolve_missing=complete)


@dataclass(frozen=True)
class _Row:
    deployment: Deployment | None
    severity: str
    evidence: dict
    patch: dict | None
    action: str
    message: str = ""

    @classmethod
    def of_hit(cls, dep: Deployment | None, hit: rules.Hit) -> _Row:
        return cls(dep, hit.severity, hit.evidence, hit.patch, hit.action, hit.message)

    def merged(self, other: _Row) -> _Row:
        causes = ", ".join(dict.fromkeys(c for c in (self.evidence.get("cause"), other.evidence.get("cause")) if c))
        evidence = {**self.evidence, **other.evidence} | ({"cause": causes} if causes else {})
        severity = "major" if "major" in (self.severity, other.severity) else self.severity
        return _Row(
            self.deployment, severity, evidence, self.patch, self.action, f"{self.message} {other.message}".strip()
        )


def _reconcile(cluster: Cluster, wanted: dict, *, owned: Q, resolve_missing: bool = True) -> dict:
    now = timezone.now()
    opened = resolved = 0
    with transaction.atomic():
        current = {
            (f.application_name, f.deployment_name, f.subject, f.rule): f
            for f in Finding.objects.filter(owned, cluster=cluster, resolved_at__isnull=True)
        }
        new = []
        for key, row in wanted.items():
            finding = current.get(key)
            if finding is None:
                new.append(
                    Finding(
                        cluster=cluster,
                        cluster_name=cluster.name,
                        deployment=row.deployment,
                        application_name=key[0],
                        deployment_name=key[1],
                        subject=key[2],
                        rule=key[3],
                        severity=row.severity,
                        evidence=row.evidence,
                        patch=row.patch,
                        action=row.action,
                        message=row.message,
                    )
                )
            elif (finding.evidence, finding.patch, finding.severity, finding.message) != (
                row.evidence,
                row.patch,
                row.severity,
                row.message,
            ):
                Finding.objects.filter(pk=finding.pk).update(
                    evidence=row.evidence, patch=row.patch, severity=row.severity, message=row.message
                )
        # One statement for a new cluster's tens of findings.
        opened = len(Finding.objects.bulk_create(new))
        gone = [f.pk for key, f in current.items() if key not in wanted] if resolve_missing else []
        if gone:
            resolved = Finding.objects.filter(pk__in=gone).update(resolved_at=now)
    return {"opened": opened, "resolved": resolved}


def first_places(findings: QuerySet[Finding], rules: list[str], order: tuple[str, ...], per_rule: int) -> list[int]:
    """The keys of the first `per_rule` findings of each rule in `order`, whatever the size of
    the fleet: each rule's read off the index in the lists' order (Finding.Meta.indexes), in one
    UNION ALL where the database takes ordered, sliced parts (PostgreSQL), else one query per rule
    (SQLite). Numbering every open finding with a window function sorted all of them: 19 ms of a
    page at 10,000 findings, and 140 ms when it read the full rows."""
    parts = [findings.filter(rule=rule).order_by(*order).values_list("pk", flat=True)[:per_rule] for rule in rules]
    if not parts:
        return []
    if connection.features.supports_slicing_ordering_in_compound:
        return list(parts[0].union(*parts[1:], all=True))
    return [pk for part in parts for pk in part]


def mute(actor: Actor, finding: Finding, reason: str) -> Finding:
    if not reason.strip():
        raise ValueError("Say why this finding is muted.")
    finding.muted_at, finding.muted_by, finding.mute_reason = timezone.now(), actor.user, reason.strip()[:2000]
    finding.save(update_fields=["muted_at", "muted_by", "mute_reason"])
    record(
        actor,
        "finding.mute",
        finding,
        team=finding.cluster.team,
        changes={"rule": finding.rule, "reason": finding.mute_reason},
    )
    return finding


def unmute(actor: Actor, finding: Finding) -> Finding:
    finding.muted_at, finding.muted_by, finding.mute_reason = None, None, ""
    finding.save(update_fields=["muted_at", "muted_by", "mute_reason"])
    record(actor, "finding.unmute", finding, team=finding.cluster.team, changes={"rule": finding.rule})
    return finding


def patch_text(finding: Finding) -> str:
    return yamltext.dump(finding.patch, sort_keys=False) if finding.patch else ""
