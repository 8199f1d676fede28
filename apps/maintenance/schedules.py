"""Writing recycle schedules and warmup profiles: validated, with their next slot, and audited."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from apps.accounts.access import Permission
from apps.accounts.audit import Actor, record
from apps.accounts.models import Role
from apps.core.redaction import PlaceholderUnmatched, redact_headers, restore_placeholders, secret_values
from apps.fleet.models import Application, Deployment
from apps.maintenance import timing
from apps.maintenance.models import RecycleSchedule, WarmupProfile

# Creating, editing or deleting a recycle schedule or a warmup profile.
MANAGE = Permission(Role.OPERATOR, "manage maintenance")

METHODS = {"GET", "POST", "PUT", "HEAD"}
MAX_REQUESTS, MAX_CONCURRENCY = 1000, 64


def _window_fields(data: dict) -> tuple:
    return (
        data.get("window_days", []),
        data.get("window_start_hour", 0),
        data.get("window_end_hour", 24),
        data.get("timezone", "UTC"),
    )


def save_schedule(actor: Actor, deployment: Deployment, data: dict) -> RecycleSchedule:
    timing.validate_timing(data.get("every_hours"), data.get("cron", ""))
    timing.validate_window(*_window_fields(data))
    warmup = data.get("warmup")
    if warmup is not None and warmup.application_id != deployment.application_id:
        raise ValidationError("The warmup profile must belong to the deployment's application.")
    schedule = RecycleSchedule.objects.filter(deployment=deployment).first() or RecycleSchedule(
        deployment=deployment, created_by=actor.user
    )
    for key, value in data.items():
        setattr(schedule, key, value)
    schedule.next_run_at = next_run(schedule, timezone.now()) if schedule.enabled else None
    if schedule.enabled and schedule.next_run_at is None:
        raise ValidationError(
            "This timing never falls inside the maintenance window: widen the window or change the timing."
        )
    with transaction.atomic():
        schedule.save()
        record(
            actor,
            "recycle_schedule.save",
            schedule,
            team=deployment.application.cluster.team,
            changes={k: str(v) for k, v in data.items()},
        )
    return schedule


def next_run(item, after):
    return timing.next_slot(
        after=after,
        every_hours=item.every_hours,
        cron=getattr(item, "cron", ""),
        days=item.window_days,
        start_hour=item.window_start_hour,
        end_hour=item.window_end_hour,
        tz=item.timezone,
    )


def validate_profile(application, data: dict) -> None:
    problems = []
    root = (application.route_prefix or "/").rstrip("/")
    path = data.get("path", "").split("?", 1)[0]
    if not path.startswith("/") or not (not root or path == root or path.startswith(root + "/")):
        problems.append(f"The path must be under the application's route prefix {application.route_prefix or '/'!r}.")
    if data.get("method", "GET").upper() not in METHODS:
        problems.append(f"Method must be one of {', '.join(sorted(METHODS))}.")
    if not 1 <= data.get("requests", 20) <= MAX_REQUESTS:
        problems.append(f"Requests must be between 1 and {MAX_REQUESTS}.")
    if not 1 <= data.get("concurrency", 2) <= MAX_CONCURRENCY:
        problems.append(f"Concurrency must be between 1 and {MAX_CONCURRENCY}.")
    if not 0 < data.get("timeout_s", 10.0) <= 300:
        problems.append("The per-request timeout must be above 0 and at most 300 s.")
    if not isinstance(data.get("headers", {}), dict) or any(
        not isinstance(v, str) for v in data.get("headers", {}).values()
    ):
        problems.append("Headers must be an object of strings.")
    if data.get("every_hours") is not None and not 1 <= data["every_hours"] <= 720:
        problems.append("every_hours must be between 1 and 720.")
    if problems:
        raise ValidationError(problems)
    timing.validate_window(*_window_fields(data))


def save_profile(actor: Actor, application, data: dict, profile: WarmupProfile | None = None) -> WarmupProfile:
    if "headers" in data:
        # Read back with their values redacted, headers may come back so: they keep what they stand for.
        stored = {"headers": profile.headers} if profile is not None else {}
        try:
            data = {**data, **restore_placeholders({"headers": data["headers"]}, secret_values(stored))}
        except PlaceholderUnmatched as exc:
            raise ValidationError(str(exc)) from exc
    validate_profile(application, data)
    profile = profile or WarmupProfile(application=application)
    for key, value in data.items():
        setattr(profile, key, value.upper() if key == "method" else value)
    profile.next_run_at = next_run(profile, timezone.now()) if profile.every_hours and profile.enabled else None
    with transaction.atomic():
        profile.save()
        record(
            actor,
            "warmup_profile.save",
            profile,
            team=application.cluster.team,
            changes={k: str(redact_headers(v) if k == "headers" else v) for k, v in data.items()},
        )
    return profile


def delete_schedule(actor: Actor, schedule: RecycleSchedule) -> None:
    with transaction.atomic():
        # Recorded before the delete: the row's id and name are gone after it.
        record(
            actor,
            "recycle_schedule.delete",
            schedule,
            team=schedule.deployment.application.cluster.team,
            changes={"deployment": str(schedule.deployment)},
        )
        schedule.delete()


def delete_profile(actor: Actor, profile: WarmupProfile) -> None:
    with transaction.atomic():
        record(
            actor,
            "warmup_profile.delete",
            profile,
            team=profile.application.cluster.team,
            changes={"application": str(profile.application), "name": profile.name},
        )
        profile.delete()


def first_warmup_request(application: Application) -> dict | None:
    """The request of the application's first warmup profile, by name: what a calibration sends
    when the operator gives none (apps.fleet.vouched_requests)."""
    profile = WarmupProfile.objects.filter(application=application).order_by("name", "id").first()
    if profile is None:
        return None
    return {"method": profile.method, "path": profile.path, "headers": profile.headers, "body": profile.body}


def warmup_requests(application: Application) -> list[dict]:
    """Every warmup profile's request, by name, weighted by the requests it sends: the preset mix
    a calibration may measure (apps.fleet.vouched_requests)."""
    return [
        {"method": p.method, "path": p.path, "headers": p.headers, "body": p.body, "weight": p.requests}
        for p in WarmupProfile.objects.filter(application=application).order_by("name", "id")
    ]
