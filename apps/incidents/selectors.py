"""Read-only queries over incidents that pages of other apps show."""

from __future__ import annotations

from django.db.models import Count

from apps.incidents.models import Incident


def mark_open_incidents(clusters) -> None:
    """Each listed cluster's open incidents, worst first, in one query for the page: a reachable cluster with an
    open critical incident is not healthy, and its row says so."""
    rank = {"critical": 0, "major": 1, "warning": 2}
    counts: dict[int, dict[str, int]] = {}
    rows = (
        Incident.objects.filter(cluster__in=[c.pk for c in clusters])
        .exclude(status=Incident.Status.RESOLVED)
        .values("cluster_id", "severity")
        .annotate(n=Count("id"))
    )
    for row in rows:
        counts.setdefault(row["cluster_id"], {})[row["severity"]] = row["n"]
    for cluster in clusters:
        by_severity = counts.get(cluster.pk, {})
        cluster.open_incidents = sorted(by_severity.items(), key=lambda kv: rank.get(kv[0], 3))
