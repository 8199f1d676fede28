"""Cluster lists as the fleet page and the clusters API show them."""

from __future__ import annotations

from django.db.models import QuerySet

from apps.clusters.models import Cluster


def cluster_listing(user) -> QuerySet[Cluster]:
    """What the fleet page and the clusters API list for this user, with the live application and
    deployment counts the last applied sync wrote on each row."""
    return Cluster.objects.visible_to(user).select_related("team").order_by("name")
