"""What the clusters app tells the apps above it, which it must not import."""

from __future__ import annotations

from django.dispatch import Signal

# Sent with `cluster` (already in its new team), `actor` and `from_team`, inside the transaction
# that moves it: what belonged to the old team (a Kubernetes link through its credentials) must
# not follow the cluster.
cluster_moved = Signal()
