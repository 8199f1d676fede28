"""Audit rows kept for FLEETDECK_AUDIT_RETENTION_DAYS (a year by default, what audits commonly ask),
then deleted by the tick in batches: every sync-driven change and every page action writes one."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from apps.accounts.models import AuditEvent
from apps.core.retention import delete_batch


def prune_audit() -> int:
    cutoff = timezone.now() - timedelta(days=settings.FLEETDECK_AUDIT_RETENTION_DAYS)
    return delete_batch(AuditEvent.objects.filter(created_at__lt=cutoff))
