"""A Ray dashboard belongs to one cluster, and so to one team.

Ray dashboards have no authentication by default: whoever registers one can deploy code onto its
nodes, delete its applications and run jobs there. So a dashboard is claimed by the addresses it
answers on, the URL's own `host:port` and every `address:port` the host resolves to (an IP
literal or another name for the same head must not get around the claim), and a second
registration of any of them is refused. The database's unique index on the address decides, so
two registrations racing each other cannot both win."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from django.db import IntegrityError, transaction

from apps.clusters.models import Cluster, DashboardEndpoint
from apps.core.errors import Conflict


class DashboardTaken(Conflict):
    """The dashboard is another cluster's (a 409). The message names a cluster only to its own team."""


def origin(url: str) -> tuple[str, str, int]:
    """The URL's scheme, host and port (the scheme's default when it names none)."""
    parts = urlsplit(url)
    return (
        parts.scheme,
        (parts.hostname or "").lower().rstrip("."),
        parts.port or (443 if parts.scheme == "https" else 80),
    )


def endpoints(url: str) -> set[str]:
    """The `host:port` addresses `url` reaches: its own host and, where it resolves, each address."""
    _, host, port = origin(url)
    found = {_address(host, port)}
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        # Unresolvable here (the connection test says so where it matters): the name alone is claimed.
        return found
    found.update(_address(info[4][0].split("%")[0], port) for info in infos)
    return found


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def claim(cluster: Cluster, addresses: set[str]) -> None:
    """Make `addresses` the cluster's, replacing what it held; DashboardTaken when another holds one.
    Runs inside the caller's transaction, which must roll back on DashboardTaken."""
    refuse_taken(cluster.team_id, addresses, exclude=cluster.pk)
    DashboardEndpoint.objects.filter(cluster=cluster).exclude(address__in=addresses).delete()
    held = set(DashboardEndpoint.objects.filter(cluster=cluster).values_list("address", flat=True))
    try:
        with transaction.atomic():
            DashboardEndpoint.objects.bulk_create(
                [DashboardEndpoint(cluster=cluster, address=address) for address in sorted(addresses - held)]
            )
    except IntegrityError as exc:
        # Another registration claimed it between the check and the insert.
        raise DashboardTaken(_ELSEWHERE) from exc


def refuse_taken(team_id: int, addresses: set[str], *, exclude: int | None = None) -> None:
    """DashboardTaken when a cluster other than `exclude` holds any of `addresses`."""
    holders = DashboardEndpoint.objects.filter(address__in=addresses).select_related("cluster")
    if exclude is not None:
        holders = holders.exclude(cluster_id=exclude)
    holder = holders.order_by("address").first()
    if holder is None:
        return
    if holder.cluster.team_id == team_id:
        raise DashboardTaken(
            f"This Ray dashboard ({holder.address}) is already registered as cluster {holder.cluster.name!r}: "
            "a dashboard is registered once."
        )
    raise DashboardTaken(_ELSEWHERE)


# Says nothing of who holds it: the name of another team's cluster is not this team's to know.
_ELSEWHERE = (
    "This Ray dashboard is already registered in Fleetdeck. A dashboard belongs to one team: "
    "if it should be yours, ask a Fleetdeck administrator to move its cluster to your team."
)
