"""Cluster registry writes. The htmx views and the API viewset both call these, nothing else."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from apps.accounts.access import Permission
from apps.accounts.audit import Actor, record
from apps.accounts.models import Role, Team
from apps.clusters import ownership
from apps.clusters.models import Cluster, ClusterEvent, Reachability
from apps.clusters.signals import cluster_moved
from apps.clusters.validation import checked_url, validate_labels
from apps.core import jobs, secrets
from integrations.ray.async_dashboard import AsyncRayDashboard
from integrations.ray.dashboard import RayDashboard
from integrations.ray.errors import RayError, RayTimeout, RayUnreachable
from integrations.ray.payloads import ServeStatus, VersionInfo

SYNC = Permission(Role.OPERATOR, "sync clusters")


class ConnectionRefused(ValidationError):
    """Registration or an URL/token change failed its connection test; nothing was saved."""


class TokenNeeded(ValidationError):
    """The dashboard moved to another origin with a stored token: the token does not follow it."""


DashboardTaken = ownership.DashboardTaken


@dataclass(frozen=True)
class Probe:
    version: VersionInfo
    auth_mode: str
    serve: ServeStatus


def dashboard_for(cluster: Cluster) -> RayDashboard:
    return RayDashboard(
        cluster.dashboard_url,
        token=secrets.decrypt(cluster.token_ciphertext),
        timeout_s=settings.FLEETDECK_RAY_TIMEOUT_S,
    )


def async_dashboard_for(cluster: Cluster) -> AsyncRayDashboard:
    """The sync's reader of `cluster`, for an event loop: see apps/fleet/sync.py."""
    return AsyncRayDashboard(
        cluster.dashboard_url,
        token=secrets.decrypt(cluster.token_ciphertext),
        timeout_s=settings.FLEETDECK_RAY_TIMEOUT_S,
    )


def probe(dashboard_url: str, token: str) -> Probe:
    """Test a dashboard the way registration needs it: version, auth mode, Serve applications."""
    with RayDashboard(dashboard_url, token=token, timeout_s=settings.FLEETDECK_RAY_TIMEOUT_S) as ray:
        try:
            version = ray.version()
            auth_mode = ray.authentication_mode()
            serve = ray.serve_applications()
        except RayError as exc:
            # Not exc.message: what a URL someone just typed answers is not shown to them (it could be
            # any service the network allows, read through Fleetdeck).
            message = f"Connection test failed: {exc.summary}"
            if exc.excerpt:
                message += " (what it answered is not shown)."
            raise ConnectionRefused(message, code=type(exc).__name__) from exc
    return Probe(version=version, auth_mode=auth_mode, serve=serve)


def register_cluster(
    actor: Actor,
    *,
    name: str,
    team: Team,
    dashboard_url: str,
    token: str = "",
    labels: dict | None = None,
    serve_config_owner: str = Cluster.ConfigOwner.DASHBOARD,
    metrics_url: str = "",
    prometheus_url: str = "",
    prometheus_selector: str = "",
    serve_url: str = "",
) -> Cluster:
    url = checked_url(dashboard_url, team)
    clean_labels = validate_labels(labels)
    metrics_url, prometheus_url, serve_url = (
        checked_url(u, team) if u else "" for u in (metrics_url, prometheus_url, serve_url)
    )
    # Before anything is sent to it: another cluster's dashboard is not probed with this token.
    addresses = ownership.endpoints(url)
    ownership.refuse_taken(team.pk, addresses)
    result = probe(url, token)
    with transaction.atomic():
        cluster = Cluster.objects.create(
            name=name,
            team=team,
            dashboard_url=url,
            token_ciphertext=secrets.encrypt(token),
            labels=clean_labels,
            serve_config_owner=serve_config_owner,
            metrics_url=metrics_url,
            prometheus_url=prometheus_url,
            prometheus_selector=prometheus_selector,
            serve_url=serve_url,
            ray_version=result.version.ray_version,
            ray_commit=result.version.ray_commit,
            session_name=result.version.session_name,
            auth_mode=result.auth_mode,
            created_by=actor.user,
            sync_requested_at=timezone.now(),
        )
        ClusterEvent.objects.create(
            cluster=cluster,
            kind=ClusterEvent.Kind.REGISTERED,
            message=f"Ray {result.version.ray_version}, dashboard authentication {result.auth_mode}.",
        )
        ownership.claim(cluster, addresses)
        record(
            actor,
            "cluster.register",
            cluster,
            team=team,
            changes={"dashboard_url": url, "labels": clean_labels, "token": "set" if token else "none"},
        )
        _enqueue_sync(cluster.pk)
    return cluster


UNSET = object()


def update_cluster(
    actor: Actor,
    cluster: Cluster,
    *,
    dashboard_url=UNSET,
    token=UNSET,
    labels=UNSET,
    team=UNSET,
    serve_config_owner=UNSET,
    metrics_url=UNSET,
    prometheus_url=UNSET,
    prometheus_selector=UNSET,
    serve_url=UNSET,
) -> Cluster:
    """Change a cluster's registration. A new URL or token is connection-tested before it is saved;
    a stored token is never sent to a URL of another origin (scheme, host and port): that takes the
    token again. Every URL is checked against the policy of the team the cluster ends up in."""
    changes: dict = {}
    new_team = cluster.team if team is UNSET else team
    if new_team != cluster.team:
        changes["team"] = {"from": cluster.team.name, "to": new_team.name}
    new_url = cluster.dashboard_url if dashboard_url is UNSET else checked_url(dashboard_url, new_team)
    if new_url != cluster.dashboard_url:
        changes["dashboard_url"] = {"from": cluster.dashboard_url, "to": new_url}
    stored_token = secrets.decrypt(cluster.token_ciphertext)
    if token is UNSET and stored_token and ownership.origin(new_url) != ownership.origin(cluster.dashboard_url):
        raise TokenNeeded(
            "The dashboard URL now points at another host or port: give its token again (or an empty token "
            "if it has none). The stored token is only ever sent to the address it was given for.",
            code="TokenNeeded",
        )
    new_token = stored_token if token is UNSET else token
    if token is not UNSET and token != stored_token:
        changes["token"] = "changed" if token else "removed"
    if labels is not UNSET:
        clean = validate_labels(labels)
        if clean != cluster.labels:
            changes["labels"] = {"from": cluster.labels, "to": clean}
            cluster.labels = clean
    for field, value in (
        ("metrics_url", metrics_url),
        ("prometheus_url", prometheus_url),
        ("serve_url", serve_url),
        ("prometheus_selector", prometheus_selector),
    ):
        if value is UNSET and field.endswith("_url") and "team" in changes and getattr(cluster, field):
            # The new team's allow-list decides where its clusters may point.
            checked_url(getattr(cluster, field), new_team)
        if value is not UNSET:
            value = checked_url(value, new_team) if value and field.endswith("_url") else (value or "")
            if value != getattr(cluster, field):
                changes[field] = {"from": getattr(cluster, field), "to": value}
                setattr(cluster, field, value)
    if "team" in changes and "dashboard_url" not in changes:
        checked_url(cluster.dashboard_url, new_team)
    if serve_config_owner is not UNSET and serve_config_owner != cluster.serve_config_owner:
        changes["serve_config_owner"] = {"from": cluster.serve_config_owner, "to": serve_config_owner}
        cluster.serve_config_owner = serve_config_owner
    addresses = None
    if "dashboard_url" in changes:
        addresses = ownership.endpoints(new_url)
        ownership.refuse_taken(new_team.pk, addresses, exclude=cluster.pk)
    if "dashboard_url" in changes or "token" in changes:
        result = probe(new_url, new_token)
        cluster.dashboard_url = new_url
        cluster.token_ciphertext = secrets.encrypt(new_token)
        cluster.ray_version = result.version.ray_version
        cluster.auth_mode = result.auth_mode
    if not changes:
        return cluster
    old_team = cluster.team
    cluster.team = new_team
    # Findings read the registration (authentication mode, metrics endpoints): the next sync applies in full.
    cluster.observed_digest = ""
    with transaction.atomic():
        cluster.save()
        if addresses is not None:
            ownership.claim(cluster, addresses)
        if "team" in changes:
            cluster_moved.send(sender=Cluster, cluster=cluster, actor=actor, from_team=old_team)
        record(actor, "cluster.update", cluster, team=cluster.team, changes=changes)
    return cluster


def delete_cluster(actor: Actor, cluster: Cluster) -> None:
    with transaction.atomic():
        record(
            actor,
            "cluster.delete",
            cluster,
            team=cluster.team,
            changes={"dashboard_url": cluster.dashboard_url, "applications": cluster.applications.count()},
        )
        cluster.delete()


def request_sync(actor: Actor, cluster: Cluster) -> Cluster:
    """Ask for a sync now. The worker does it; the UI polls until last_sync_at passes this request."""
    with transaction.atomic():
        cluster.sync_requested_at = timezone.now()
        Cluster.objects.filter(pk=cluster.pk).update(sync_requested_at=cluster.sync_requested_at)
        record(actor, "cluster.sync_requested", cluster, team=cluster.team)
        _enqueue_sync(cluster.pk)
    return cluster


def _enqueue_sync(cluster_id: int) -> None:
    transaction.on_commit(lambda: _send_sync(cluster_id))


def _send_sync(cluster_id: int) -> None:
    if not jobs.enqueue(jobs.SYNC_CLUSTER, cluster_id):
        # Due at once: the tick's next pass over due clusters sends it, not the one a full interval away.
        Cluster.objects.filter(pk=cluster_id).update(next_sync_at=None)


def mark_unreachable(cluster: Cluster, error: RayError, *, at) -> None:
    """Record a failed sync in one UPDATE, plus an event when the cluster flips state."""
    unreachable = isinstance(error, (RayUnreachable, RayTimeout))
    state = Reachability.UNREACHABLE if unreachable else Reachability.ERROR
    if cluster.reachability != state:
        ClusterEvent.objects.create(cluster=cluster, kind=ClusterEvent.Kind.UNREACHABLE, message=error.message)
    Cluster.objects.filter(pk=cluster.pk).update(
        reachability=state, last_error=error.message, last_error_at=at, last_sync_at=at
    )
