"""What the Kubernetes app tells the remediation app above it, which it must not import."""

from __future__ import annotations

from django.dispatch import Signal

# Sent with `cluster`, `findings` (the K1-K4 `checks.Finding`s of an inspection; none when a link
# goes away) and `complete` (False when the inspection saw only part of the cluster: findings it
# did not repeat are kept, not resolved).
kube_findings_checked = Signal()
