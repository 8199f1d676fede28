"""Cluster lists with what the fleet observed of them: the clusters app knows nothing of
applications and deployments, so the counts are joined here."""

from __future__ import annotations

from django.db import models
from django.db.models import OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce

from apps.clusters.models import Cluster
from apps.fleet.models import Application, Deployment


def with_counts(clusters: QuerySet[Cluster]) -> QuerySet[Cluster]:
    """Live applications and deployments per cluster, in the same query. Correlated subqueries
    rather than a join and GROUP BY: the database counts only the rows of the page it returns,
    and a paginator's COUNT leaves them out (the join aggregated the whole fleet for both)."""

    def live(queryset, cluster: str) -> Coalesce:
        per_cluster = queryset.filter(**{cluster: OuterRef("pk")}).order_by().values(cluster)
        return Coalesce(Subquery(per_cluster.annotate(n=models.Count("pk")).values("n")), 0)

    return clusters.annotate(
        application_count=live(Application.objects.filter(removed_at__isnull=True), "cluster"),
        deployment_count=live(
            Deployment.objects.filter(removed_at__isnull=True, application__removed_at__isnull=True),
            "application__cluster",
        ),
    )


def cluster_listing(user) -> QuerySet[Cluster]:
    """What the fleet page and the clusters API list for this user."""
    return with_counts(Cluster.objects.visible_to(user)).select_related("team").order_by("name")
