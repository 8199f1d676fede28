"""Creating and deleting scalers, audited. Only shadow scalers are created here: turning one
active goes through the change protocol (apps.scaler.control)."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from apps.accounts.access import Permission
from apps.accounts.audit import Actor, record
from apps.accounts.models import Role
from apps.fleet.models import Deployment
from apps.scaler.models import Scaler

# Creating or deleting a deployment's scaler.
MANAGE = Permission(Role.OPERATOR, "manage scalers")
# Above this a typo, not a fleet: Serve's own autoscaler has no such bound, but one control plane
# deciding thousands of replicas of one deployment is a mistake to refuse.
MAX_REPLICAS = 1000


def validate(
    min_replicas: int, max_replicas: int, concurrency: int | None = None, service_s: float | None = None
) -> None:
    if min_replicas < 1:
        raise ValidationError("min_replicas must be at least 1: a shadow scaler does not scale to zero.")
    if max_replicas < min_replicas:
        raise ValidationError("max_replicas must be at least min_replicas.")
    if max_replicas > MAX_REPLICAS:
        raise ValidationError(f"max_replicas must be at most {MAX_REPLICAS}.")
    if concurrency is not None and concurrency < 1:
        raise ValidationError("concurrency must be at least 1 request per replica.")
    if service_s is not None and not service_s > 0:
        raise ValidationError("service_s must be a positive number of seconds.")


def create_shadow_scaler(
    actor: Actor,
    deployment: Deployment,
    *,
    min_replicas: int,
    max_replicas: int,
    latency_objective_ms: int | None = None,
    concurrency: int | None = None,
    service_s: float | None = None,
) -> Scaler:
    validate(min_replicas, max_replicas, concurrency, service_s)
    fields = {
        "min_replicas": min_replicas,
        "max_replicas": max_replicas,
        "latency_objective_ms": latency_objective_ms,
        "concurrency": concurrency,
        "service_s": service_s,
    }
    try:
        with transaction.atomic():
            scaler = Scaler.objects.create(
                deployment=deployment, mode=Scaler.Mode.SHADOW, created_by=actor.user, **fields
            )
            record(
                actor,
                "scaler.create",
                scaler,
                team=deployment.application.cluster.team,
                changes={"mode": Scaler.Mode.SHADOW, **{k: v for k, v in fields.items() if v is not None}},
            )
    except IntegrityError as exc:
        # The one-to-one refuses a second scaler, also one created at the same moment.
        raise ValidationError(f"{deployment} already has a scaler: delete it first.") from exc
    return scaler


def delete_scaler(actor: Actor, scaler: Scaler) -> None:
    if scaler.mode in (Scaler.Mode.ACTIVE, Scaler.Mode.HANDING_BACK):
        # Deleted in control, it would leave the count fixed where it was and nothing watching it.
        raise ValidationError(
            f"The scaler is {scaler.get_mode_display().lower()}: turn it off first (deactivate), so Serve's "
            "autoscaler gets the deployment back."
        )
    with transaction.atomic():
        # Recorded before the delete: the row's id is gone after it.
        record(
            actor,
            "scaler.delete",
            scaler,
            team=scaler.deployment.application.cluster.team,
            changes={"deployment": str(scaler.deployment), "mode": scaler.mode},
        )
        scaler.delete()
