"""Kubernetes connections and links: every write, audited. Views and the API call these only.

A kubeconfig is a credential: it is stored encrypted, never returned, and the audit log says
only that it was set or changed."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction

from apps.accounts.access import Permission
from apps.accounts.audit import Actor, record
from apps.accounts.models import Role, Team
from apps.clusters import services as cluster_services
from apps.clusters.models import Cluster
from apps.clusters.validation import validate_token
from apps.core import jobs, secrets
from apps.kubernetes import discovery
from apps.kubernetes.models import KubeConnection, KubeLink
from apps.kubernetes.signals import kube_findings_checked
from apps.kubernetes.validation import check_kubeconfig, parse_kubeconfig, validate_cluster_name, validate_namespaces
from integrations.kubernetes.errors import KubeError

ADD_CONNECTION = Permission(Role.ADMIN, "add Kubernetes connections")
CHANGE_CONNECTION = Permission(Role.ADMIN, "change Kubernetes connections")
DELETE_CONNECTION = Permission(Role.ADMIN, "delete Kubernetes connections")
REGISTER = Permission(Role.ADMIN, "register clusters")
LINK = Permission(Role.ADMIN, "link clusters")
UNLINK = Permission(Role.ADMIN, "unlink clusters")
INSPECT = Permission(Role.OPERATOR, "inspect clusters")

UNSET = object()


def create_connection(
    actor: Actor,
    *,
    team: Team,
    name: str,
    namespaces,
    in_cluster: bool = False,
    kubeconfig: str = "",
    context: str = "",
    read_only: bool = True,
) -> KubeConnection:
    if in_cluster:
        _require_in_cluster_rights(
            actor,
            (
                "Only a Fleetdeck superuser can use Fleetdeck's own service account: it can read every team's "
                "namespaces. Give a kubeconfig whose credentials reach only your team's namespaces."
            ),
        )
    KubeConnection._meta.get_field("name").run_validators(name)
    if KubeConnection.objects.filter(team=team, name=name).exists():
        raise ValidationError(f"Team {team} already has a Kubernetes connection named {name}.", code="name")
    namespaces = validate_namespaces(namespaces)
    ciphertext = _checked_credentials(in_cluster, kubeconfig, context, team)
    with transaction.atomic():
        connection = KubeConnection.objects.create(
            team=team,
            name=name,
            in_cluster=in_cluster,
            kubeconfig_ciphertext=ciphertext,
            context=context,
            namespaces=namespaces,
            read_only=read_only,
            created_by=actor.user,
        )
        record(
            actor,
            "kube.connection.create",
            connection,
            team=team,
            changes={
                "in_cluster": in_cluster,
                "kubeconfig": "set" if kubeconfig else "none",
                "context": context,
                "namespaces": namespaces,
                "read_only": read_only,
            },
        )
    return connection


def update_connection(
    actor: Actor,
    connection: KubeConnection,
    *,
    kubeconfig=UNSET,
    context=UNSET,
    namespaces=UNSET,
    read_only=UNSET,
) -> KubeConnection:
    """Change a connection. A new kubeconfig or context is loaded and checked before it is saved."""
    changes: dict = {}
    if namespaces is not UNSET:
        clean = validate_namespaces(namespaces)
        if clean != connection.namespaces:
            if connection.in_cluster:
                # The namespaces are all that keeps a team inside its own part of the cluster.
                _require_in_cluster_rights(
                    actor,
                    (
                        f"Connection {connection.name} uses Fleetdeck's own service account: only a Fleetdeck "
                        "superuser can change its namespaces."
                    ),
                )
            changes["namespaces"] = {"from": connection.namespaces, "to": clean}
            connection.namespaces = clean
    if (kubeconfig is not UNSET and kubeconfig) or (context is not UNSET and context != connection.context):
        text = (
            kubeconfig if kubeconfig is not UNSET and kubeconfig else secrets.decrypt(connection.kubeconfig_ciphertext)
        )
        new_context = connection.context if context is UNSET else context
        connection.kubeconfig_ciphertext = _checked_credentials(
            connection.in_cluster, text, new_context, connection.team
        )
        if kubeconfig is not UNSET and kubeconfig:
            changes["kubeconfig"] = "changed"
        if new_context != connection.context:
            changes["context"] = {"from": connection.context, "to": new_context}
            connection.context = new_context
    if read_only is not UNSET and read_only != connection.read_only:
        # Turning writes on is what lets Fleetdeck patch RayServices: worth its own line in the log.
        changes["read_only"] = {"from": connection.read_only, "to": read_only}
        connection.read_only = read_only
    if not changes:
        return connection
    with transaction.atomic():
        connection.save()
        record(actor, "kube.connection.update", connection, team=connection.team, changes=changes)
    return connection


def delete_connection(actor: Actor, connection: KubeConnection) -> None:
    with transaction.atomic():
        links = list(connection.links.select_related("cluster"))
        for link in links:
            # Nothing will inspect these clusters any more: their Kubernetes findings would never resolve.
            kube_findings_checked.send(KubeLink, cluster=link.cluster, findings=[], complete=True)
        record(
            actor,
            "kube.connection.delete",
            connection,
            team=connection.team,
            changes={"unlinked": sorted(link.cluster.name for link in links)},
        )
        connection.delete()


def can_use_in_cluster(user) -> bool:
    """Fleetdeck's own service account reads every namespace (deploy/k8s/rbac.yaml), other teams'
    included: only a superuser may point a connection at it."""
    return bool(getattr(user, "is_superuser", False))


def _require_in_cluster_rights(actor: Actor, refusal: str) -> None:
    if not can_use_in_cluster(actor.user):
        raise PermissionDenied(refusal)


def _checked_credentials(in_cluster: bool, kubeconfig: str, context: str, team: Team) -> str:
    if in_cluster:
        if kubeconfig:
            raise ValidationError(
                "Give a kubeconfig or use the in-cluster service account, not both.", code="kubeconfig"
            )
        return ""
    check_kubeconfig(parse_kubeconfig(kubeconfig), context, team)
    return secrets.encrypt(kubeconfig)


# --- links -----------------------------------------------------------------------------------


def register_discovered(
    actor: Actor,
    connection: KubeConnection,
    *,
    kind: str,
    namespace: str,
    name: str,
    cluster_name: str,
    dashboard_url: str = "",
    token: str = "",
    labels: dict | None = None,
) -> Cluster:
    """Register a discovered RayCluster or RayService as a Fleetdeck cluster of the connection's
    team, linked to it. Registration is the ordinary one (URL policy, connection test)."""
    validate_cluster_name(cluster_name)
    # register_cluster leaves the token to its callers' forms; a token no header can carry must not be stored.
    token = validate_token(token)
    _refuse_linked_resource(connection, kind, namespace, name)
    found = _find(connection, kind, namespace, name)
    with transaction.atomic():
        cluster = cluster_services.register_cluster(
            actor,
            name=cluster_name,
            team=connection.team,
            dashboard_url=dashboard_url or found.dashboard_url,
            token=token,
            labels=labels,
            serve_config_owner=_owner(kind),
        )
        _create_link(actor, connection, cluster, found)
    return cluster


def link_cluster(
    actor: Actor, connection: KubeConnection, cluster: Cluster, *, kind: str, namespace: str, name: str
) -> KubeLink:
    """Link a registered cluster to a RayCluster or RayService. A RayService link makes the
    cluster RayService-owned: its changes then patch serveConfigV2 instead of the dashboard."""
    if cluster.team_id != connection.team_id:
        raise ValidationError(
            f"Connection {connection.name} belongs to team {connection.team}; {cluster.name} does not."
        )
    existing = KubeLink.objects.filter(cluster=cluster).first()
    if existing is not None:
        raise ValidationError(f"{cluster.name} is already linked to {existing.resource}; unlink it first.")
    _refuse_linked_resource(connection, kind, namespace, name)
    found = _find(connection, kind, namespace, name)
    with transaction.atomic():
        if cluster.serve_config_owner != _owner(kind):
            cluster_services.update_cluster(actor, cluster, serve_config_owner=_owner(kind))
        return _create_link(actor, connection, cluster, found)


def unlink(actor: Actor, link: KubeLink) -> None:
    """Forget the link. The cluster keeps its config owner: a RayService-owned cluster stays
    closed to dashboard pushes, which KubeRay would revert."""
    with transaction.atomic():
        kube_findings_checked.send(KubeLink, cluster=link.cluster, findings=[], complete=True)
        record(actor, "kube.unlink", link.cluster, team=link.cluster.team, changes={"resource": link.resource})
        link.delete()


def unlink_moved(sender, *, cluster: Cluster, actor: Actor, from_team, **kwargs) -> None:
    """A cluster moved to another team leaves behind its link through the old team's connection:
    the new team must not inspect or patch with the old team's credentials."""
    link = KubeLink.objects.filter(cluster=cluster).exclude(connection__team_id=cluster.team_id).first()
    if link is not None:
        unlink(actor, link)


def request_inspection(actor: Actor, link: KubeLink) -> KubeLink:
    with transaction.atomic():
        record(actor, "kube.inspect_requested", link.cluster, team=link.cluster.team)
        _enqueue_inspection(link.cluster_id)
    return link


def linked(cluster_ids: list[int]) -> set[int]:
    return set(KubeLink.objects.filter(cluster_id__in=cluster_ids).values_list("cluster_id", flat=True))


def _find(connection: KubeConnection, kind: str, namespace: str, name: str) -> discovery.Found:
    if kind not in KubeLink.Kind.values:
        raise ValidationError(f"Kind must be one of {', '.join(KubeLink.Kind.values)}.", code="kind")
    try:
        return discovery.find(connection, kind, namespace, name)
    except KubeError as exc:
        raise ValidationError(exc.message, code=type(exc).__name__) from exc


def _refuse_linked_resource(connection: KubeConnection, kind: str, namespace: str, name: str) -> None:
    taken = (
        KubeLink.objects.filter(connection=connection, kind=kind, namespace=namespace, name=name)
        .select_related("cluster")
        .first()
    )
    if taken is not None:
        raise ValidationError(f"{taken.resource} is already linked to cluster {taken.cluster.name}.")


def _owner(kind: str) -> str:
    return Cluster.ConfigOwner.RAYSERVICE if kind == KubeLink.Kind.RAYSERVICE else Cluster.ConfigOwner.DASHBOARD


def _create_link(actor: Actor, connection: KubeConnection, cluster: Cluster, found: discovery.Found) -> KubeLink:
    link = KubeLink.objects.create(
        cluster=cluster,
        connection=connection,
        kind=found.kind,
        namespace=found.namespace,
        name=found.name,
        created_by=actor.user,
    )
    record(
        actor,
        "kube.link",
        cluster,
        team=cluster.team,
        changes={"resource": link.resource, "connection": connection.name},
    )
    _enqueue_inspection(cluster.pk)
    return link


def _enqueue_inspection(cluster_id: int) -> None:
    # A message the broker refused delays the inspection to the one after the cluster's next sync.
    transaction.on_commit(lambda: jobs.enqueue(jobs.INSPECT_KUBERNETES, cluster_id))
