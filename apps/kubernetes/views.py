"""Kubernetes pages: connections, discovery with register/link, and the cluster page's card.
Every write is a service call; these only translate HTTP."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Count
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from apps.accounts import access
from apps.accounts.access import Permission
from apps.accounts.audit import Actor
from apps.accounts.models import Role
from apps.accounts.permissions import has_role, teams_where
from apps.clusters.models import Cluster
from apps.kubernetes import discovery, services
from apps.kubernetes.forms import ConnectionForm, LinkForm, RegisterForm, linkable_clusters
from apps.kubernetes.models import KubeConnection, KubeLink
from apps.kubernetes.validation import suggested_cluster_name


def _connection(request, pk: int, permission: Permission | None = None) -> KubeConnection:
    """The connection if the user sees it (404 otherwise), and, given a permission, may do that to it (403)."""
    connection = access.get_visible_or_404(request.user, KubeConnection.objects.select_related("team"), pk=pk)
    if permission is not None:
        access.demand(request.user, connection.team, permission)
    return connection


def _cluster(request, pk: int, permission: Permission) -> Cluster:
    cluster = access.get_visible_or_404(request.user, Cluster.objects.select_related("team"), pk=pk)
    access.demand(request.user, cluster.team, permission)
    return cluster


@login_required
def connection_list(request):
    connections = (
        KubeConnection.objects.visible_to(request.user)
        .select_related("team")
        .annotate(link_count=Count("links"))
        .order_by("team__name", "name")
    )
    return render(
        request,
        "kubernetes/connection_list.html",
        {
            "connections": connections,
            "can_add": teams_where(request.user, Role.ADMIN).exists(),
        },
    )


@login_required
def connection_create(request):
    if not teams_where(request.user, services.ADD_CONNECTION.role).exists():
        raise PermissionDenied("Only team admins add Kubernetes connections.")
    form = ConnectionForm(request.POST or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        access.demand(request.user, data["team"], services.ADD_CONNECTION)
        try:
            connection = services.create_connection(
                Actor.from_request(request),
                team=data["team"],
                name=data["name"],
                namespaces=data["namespaces"],
                in_cluster=data["in_cluster"],
                kubeconfig=data["kubeconfig"],
                context=data["context"],
                read_only=data["read_only"],
            )
        except ValidationError as exc:
            form.add_error("name" if exc.code == "name" else None, exc)
        else:
            messages.success(request, f"Added {connection.name}. Here is what it can see.")
            return redirect("kubernetes:connection", pk=connection.pk)
    return render(request, "kubernetes/connection_form.html", {"form": form, "creating": True})


@login_required
def connection_edit(request, pk: int):
    connection = _connection(request, pk, services.CHANGE_CONNECTION)
    form = ConnectionForm(request.POST or None, user=request.user, instance=connection)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            services.update_connection(
                Actor.from_request(request),
                connection,
                kubeconfig=data["kubeconfig"],
                context=data["context"],
                namespaces=data["namespaces"],
                read_only=data["read_only"],
            )
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            messages.success(request, f"Saved {connection.name}.")
            return redirect("kubernetes:connection", pk=connection.pk)
    return render(
        request, "kubernetes/connection_form.html", {"form": form, "connection": connection, "creating": False}
    )


@login_required
@require_POST
def connection_delete(request, pk: int):
    connection = _connection(request, pk, services.DELETE_CONNECTION)
    services.delete_connection(Actor.from_request(request), connection)
    messages.success(
        request, f"Deleted {connection.name}; its clusters are no longer linked. Nothing changed in Kubernetes."
    )
    return redirect("kubernetes:connections")


@login_required
def connection_detail(request, pk: int):
    """The discovery page: what the connection sees now, each resource with register or link."""
    connection = _connection(request, pk)
    found = discovery.discover(connection)
    can_admin = has_role(request.user, connection.team, Role.ADMIN)
    linkable = list(linkable_clusters(connection)) if can_admin else []
    return render(
        request,
        "kubernetes/discovery.html",
        {
            "connection": connection,
            "discovery": found,
            "can_admin": can_admin,
            "linkable": linkable,
            "links": connection.links.select_related("cluster").order_by("cluster__name"),
        },
    )


@login_required
def register(request, pk: int):
    connection = _connection(request, pk, services.REGISTER)
    source = request.POST if request.method == "POST" else request.GET
    resource = {key: source.get(key, "") for key in ("kind", "namespace", "name")}
    if resource["kind"] not in KubeLink.Kind.values or not resource["namespace"] or not resource["name"]:
        messages.error(request, "Choose a RayCluster or RayService from the discovery page.")
        return redirect("kubernetes:connection", pk=connection.pk)
    form = RegisterForm(request.POST or None, initial={"cluster_name": suggested_cluster_name(resource["name"])})
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            cluster = services.register_discovered(
                Actor.from_request(request),
                connection,
                **resource,
                cluster_name=data["cluster_name"],
                dashboard_url=data["dashboard_url"],
                token=data["token"],
                labels=data["labels"],
            )
        except ValidationError as exc:
            # The connection test's refusals name the Ray error; the token is at fault only for an auth refusal.
            field = (
                "token"
                if exc.code == "RayAuthRefused"
                else "dashboard_url"
                if (exc.code or "").startswith("Ray")
                else None
            )
            form.add_error(field, exc)
        else:
            messages.success(
                request,
                f"Registered {cluster.name}, linked to {resource['kind']} {resource['namespace']}/{resource['name']}.",
            )
            return redirect("fleet:cluster", pk=cluster.pk)
    return render(
        request, "kubernetes/register_form.html", {"form": form, "connection": connection, "resource": resource}
    )


@login_required
@require_POST
def link(request, pk: int):
    connection = _connection(request, pk, services.LINK)
    form = LinkForm(request.POST, connection=connection)
    if not form.is_valid():
        messages.error(request, " ".join(message for errors in form.errors.values() for message in errors))
        return redirect("kubernetes:connection", pk=connection.pk)
    data = form.cleaned_data
    try:
        services.link_cluster(
            Actor.from_request(request),
            connection,
            data["cluster"],
            kind=data["kind"],
            namespace=data["namespace"],
            name=data["name"],
        )
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
        return redirect("kubernetes:connection", pk=connection.pk)
    messages.success(request, f"Linked {data['cluster'].name} to {data['kind']} {data['namespace']}/{data['name']}.")
    return redirect("fleet:cluster", pk=data["cluster"].pk)


@login_required
@require_POST
def unlink(request, cluster_pk: int):
    cluster = _cluster(request, cluster_pk, services.UNLINK)
    link = get_object_or_404(KubeLink, cluster=cluster)
    services.unlink(Actor.from_request(request), link)
    messages.success(request, f"{cluster.name} is no longer linked to {link.resource}.")
    return redirect("fleet:cluster", pk=cluster.pk)


@login_required
@require_POST
def inspect(request, cluster_pk: int):
    cluster = _cluster(request, cluster_pk, services.INSPECT)
    services.request_inspection(Actor.from_request(request), get_object_or_404(KubeLink, cluster=cluster))
    messages.info(request, f"Kubernetes inspection of {cluster.name} queued.")
    return redirect("fleet:cluster", pk=cluster.pk)


def card_context(cluster: Cluster) -> dict:
    """The cluster page's Kubernetes card, under `kube`; the page's own roles decide the buttons."""
    link = KubeLink.objects.select_related("connection").filter(cluster=cluster).first()
    return {"link": link, "snapshot": link.snapshot if link else {}}
