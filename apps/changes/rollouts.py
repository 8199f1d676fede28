"""Fleet rollouts: one change per cluster, in waves, through the same push protocol."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Count, Prefetch, QuerySet
from django.utils import timezone

from apps.accounts import access
from apps.accounts.audit import Actor, record
from apps.accounts.models import Role
from apps.accounts.permissions import teams_where
from apps.changes import protocol
from apps.changes.models import Change, ChangeState, Preset, Rollout
from apps.changes.validation import preset_or_options, validate_options
from apps.clusters.labels import labelled
from apps.clusters.models import Cluster
from apps.clusters.validation import parse_label_selector
from apps.core.errors import Conflict
from apps.fleet import client_impact
from apps.fleet.models import Deployment

DEFAULT_BUDGET = Rollout._meta.get_field("client_error_budget").default

SELECTION_KEYS = ("team", "label", "cluster", "application", "deployment", "uses_gpu")


# --- who may plan and run a rollout: the rollout pages and the API ask here --------------------


def require_may_plan(user) -> None:
    """A rollout only ever selects clusters where its author operates (`select_deployments`):
    someone who operates nowhere has nothing to plan."""
    if not teams_where(user, Role.OPERATOR).exists():
        raise PermissionDenied("Only operators and admins run rollouts.")


def may_plan(user) -> bool:
    try:
        require_may_plan(user)
    except PermissionDenied:
        return False
    return True


def require_may_run(user, rollout: Rollout) -> None:
    """Starting or cancelling acts on every change of the rollout, so it takes the operator role
    in the team of each one, including changes the user cannot see (`seen_by`)."""
    for change in _all_changes(rollout).select_related("cluster__team"):
        access.require(user, change.cluster.team, Role.OPERATOR, "run this rollout")


def may_run(user, rollout: Rollout) -> bool:
    try:
        require_may_run(user, rollout)
    except PermissionDenied:
        return False
    return True


def select_deployments(user, selection: dict) -> dict[Cluster, list[dict]]:
    """Deployments matching the filters, in clusters where the user may change things."""
    unknown = set(selection) - set(SELECTION_KEYS)
    if unknown:
        raise ValidationError(f"Unknown filter(s): {', '.join(sorted(unknown))}. Use {', '.join(SELECTION_KEYS)}.")
    deployments = Deployment.objects.filter(
        removed_at__isnull=True,
        application__removed_at__isnull=True,
        application__cluster__team__in=teams_where(user, Role.OPERATOR),
    ).select_related("application__cluster")
    if selection.get("team"):
        deployments = deployments.filter(application__cluster__team__slug=selection["team"])
    if selection.get("cluster"):
        deployments = deployments.filter(application__cluster__name=selection["cluster"])
    if selection.get("label"):
        key, value = parse_label_selector(str(selection["label"]))
        deployments = labelled(deployments, key, value, labels="application__cluster__labels")
    if selection.get("application"):
        deployments = deployments.filter(application__name=selection["application"])
    if selection.get("deployment"):
        deployments = deployments.filter(name=selection["deployment"])
    if selection.get("uses_gpu") is not None:
        deployments = (
            deployments.filter(num_gpus__gt=0) if selection["uses_gpu"] else deployments.exclude(num_gpus__gt=0)
        )
    grouped: dict[Cluster, list[dict]] = {}
    for dep in deployments.order_by("application__cluster__name", "application__name", "name"):
        grouped.setdefault(dep.application.cluster, []).append(
            {"application": dep.application.name, "deployment": dep.name}
        )
    return grouped


def plan_rollout(
    actor: Actor,
    *,
    selection: dict,
    reason: str,
    preset: Preset | None = None,
    options: dict | None = None,
    canary: str | None = None,
    client_error_budget: float | None = None,
) -> Rollout:
    options = preset_or_options(preset, options)
    budget = DEFAULT_BUDGET if client_error_budget is None else client_error_budget
    if not 0 <= budget <= 1:
        raise ValidationError("The client error budget is a share of requests, between 0 and 1 (0.001 = 0.1 %).")
    validate_options(options)
    grouped = select_deployments(actor.user, selection)
    if not grouped:
        raise ValidationError("No deployment you may change matches these filters.")
    clusters = sorted(grouped, key=lambda c: (c.name != canary, c.name))
    if canary and clusters[0].name != canary:
        raise ValidationError(f"The canary cluster {canary!r} has no matching deployment.")
    problems: list[str] = []
    with transaction.atomic():
        rollout = Rollout.objects.create(
            reason=reason,
            preset=preset,
            options=options,
            selection=selection,
            created_by=actor.user,
            client_error_budget=budget,
        )
        for index, cluster in enumerate(clusters):
            try:
                change = protocol.plan_change(
                    actor, cluster, targets=grouped[cluster], reason=f"Rollout #{rollout.pk}: {reason}", options=options
                )
            except ValidationError as exc:
                problems.append(f"{cluster.name}: {' '.join(exc.messages)}")
                continue
            Change.objects.filter(pk=change.pk).update(rollout=rollout, wave=0 if index == 0 else 1)
        if problems:
            raise ValidationError(["The rollout cannot be planned:", *problems])
        record(
            actor,
            "rollout.plan",
            rollout,
            changes={
                "reason": reason,
                "selection": selection,
                "clusters": [c.name for c in clusters],
                "client_error_budget": budget,
            },
        )
    return rollout


def start(actor: Actor, rollout: Rollout) -> Rollout:
    if not Rollout.objects.filter(pk=rollout.pk, state=Rollout.State.PLANNED).update(
        state=Rollout.State.RUNNING, started_at=timezone.now()
    ):
        raise Conflict("Only a planned rollout can be started.")
    rollout.refresh_from_db()
    record(actor, "rollout.start", rollout, changes={"reason": rollout.reason})
    _apply_wave(actor, rollout, 0)
    return rollout


def cancel(actor: Actor, rollout: Rollout) -> Rollout:
    if not Rollout.objects.filter(pk=rollout.pk, state__in=[Rollout.State.PLANNED, Rollout.State.RUNNING]).update(
        state=Rollout.State.CANCELLED, finished_at=timezone.now()
    ):
        raise Conflict("The rollout has already finished.")
    _cancel_planned(rollout)
    record(actor, "rollout.cancel", rollout)
    rollout.refresh_from_db()
    return rollout


def advance(rollout_id: int) -> None:
    """Move a running rollout on: next wave when the current one succeeded, stop at a failure."""
    rollout = Rollout.objects.filter(pk=rollout_id, state=Rollout.State.RUNNING).first()
    if rollout is None:
        return
    wave = list(_all_changes(rollout).filter(wave=rollout.current_wave))
    if any(change.state == ChangeState.PLANNED for change in wave):
        # The wave was entered but not all of it applied: a worker died between moving the rollout
        # on (or starting it) and applying. Counting those changes as done would skip the wave.
        return _apply_wave(Actor.system(), rollout, rollout.current_wave)
    if any(not change.is_final for change in wave):
        return
    failed = [c for c in wave if c.is_final and c.state != ChangeState.SUCCEEDED]
    if failed:
        return _stop(
            rollout, "; ".join(f"{c.cluster.name}: change #{c.pk} {c.get_state_display().lower()}" for c in failed)
        )
    impact = wave_impact(wave)
    if over_budget(rollout, impact):
        return _stop_and_roll_back(rollout, wave, impact)
    next_wave = rollout.current_wave + 1
    if not _all_changes(rollout).filter(wave=next_wave).exists():
        Rollout.objects.filter(pk=rollout.pk, state=Rollout.State.RUNNING).update(
            state=Rollout.State.SUCCEEDED, finished_at=timezone.now()
        )
        return
    if Rollout.objects.filter(pk=rollout.pk, current_wave=rollout.current_wave).update(current_wave=next_wave):
        _apply_wave(Actor.system(), rollout, next_wave)


def _all_changes(rollout: Rollout):
    """Every change of the rollout, from the database: `rollout.changes` may hold only the ones
    one user may see (`seen_by`), and acting on those alone would split the rollout."""
    return Change.objects.filter(rollout_id=rollout.pk)


def _apply_wave(actor: Actor, rollout: Rollout, wave: int) -> None:
    for change in _all_changes(rollout).filter(wave=wave, state=ChangeState.PLANNED).select_related("cluster"):
        if not Rollout.objects.filter(pk=rollout.pk, state=Rollout.State.RUNNING).exists():
            return  # cancelled or stopped meanwhile: queue nothing more
        try:
            protocol.request_apply(actor, change)
        except ValidationError as exc:
            if not Change.objects.filter(pk=change.pk, state=ChangeState.PLANNED).exists():
                continue  # a concurrent tick or start applied it first
            return _stop(rollout, f"{change.cluster.name}: {' '.join(exc.messages)}")


def _stop(rollout: Rollout, why: str) -> None:
    Rollout.objects.filter(pk=rollout.pk).update(state=Rollout.State.FAILED, error=why, finished_at=timezone.now())
    _cancel_planned(rollout)
    record(Actor.system(), "rollout.failed", rollout, changes={"error": why})


def wave_impact(changes: list[Change]) -> dict:
    """What the wave's clients saw at the proxies while its changes ran, all clusters together."""
    return client_impact.combined([change.client_impact for change in changes])


def over_budget(rollout: Rollout, impact: dict) -> bool:
    """Whether the wave's clients (its `wave_impact`) saw more failed requests at the proxy than the
    rollout's budget; a wave whose proxies could not be read is not judged (its changes' steps say why)."""
    share = impact["share"]
    return share is not None and share > rollout.client_error_budget


def _stop_and_roll_back(rollout: Rollout, wave: list[Change], total: dict) -> None:
    # Only the caller that stops the rollout rolls the wave back: advance runs from the change
    # signal and from the tick, and two rollbacks of one change would queue two restores.
    budget = f"{100 * rollout.client_error_budget:g} %"
    if not Rollout.objects.filter(pk=rollout.pk, state=Rollout.State.RUNNING).update(
        state=Rollout.State.FAILED,
        error=f"Wave {rollout.current_wave + 1} over its client error budget ({budget}).",
        finished_at=timezone.now(),
    ):
        return
    _cancel_planned(rollout)
    # One part per cluster, each naming its cluster first: a user sees the parts of their teams.
    parts = []
    for change in wave:
        seen = change.client_impact or {}
        part = (
            f"{change.cluster.name}: change #{change.pk} verified, but clients saw {seen.get('failed', 0)} of "
            f"{seen.get('requests', 0)} requests fail at the proxy (the wave: {100 * total['share']:.2f} %, "
            f"over the {budget} budget)"
        )
        try:
            restore = protocol.roll_back_change(Actor.system(), change)
        except ValidationError as exc:
            part += f", and could not be rolled back: {' '.join(exc.messages)}"
        else:
            part += f", rolled back by change #{restore.pk}"
        parts.append(part)
    why = "; ".join(parts)
    Rollout.objects.filter(pk=rollout.pk).update(error=why)
    record(Actor.system(), "rollout.failed", rollout, changes={"error": why})


def _cancel_planned(rollout: Rollout) -> None:
    for change in _all_changes(rollout).filter(state=ChangeState.PLANNED):
        try:
            protocol.cancel(Actor.system(), change)
        except ValidationError:
            continue  # applied by a tick a moment before: it runs, and is no longer the rollout's to cancel


def on_change_finished(sender, change: Change, **kwargs) -> None:
    """A change of a rollout that ran to an end moves its rollout on; a cancelled one was
    cancelled by the rollout itself, or by someone the rollout's own cancel then follows."""
    if change.rollout_id and change.state != ChangeState.CANCELLED:
        advance(change.rollout_id)


def running_rollouts() -> list[int]:
    return list(Rollout.objects.filter(state=Rollout.State.RUNNING).values_list("pk", flat=True))


def advance_running() -> None:
    for rollout_id in running_rollouts():
        advance(rollout_id)


# --- what one user sees of a rollout ----------------------------------------------------------


def seen_by(user, rollouts: QuerySet[Rollout]) -> QuerySet[Rollout]:
    """Rollouts with only the changes on the user's teams prefetched: a rollout spans teams, and
    the changes, cluster names and errors of another team are not the user's to read. Changes
    are joined to their cluster: prefetching clusters by id would list every cluster of the
    page's rollouts, past SQLite's limit of 1,000 terms for a fleet-wide rollout."""
    # Only what a rollout shows of each change: a fleet-wide rollout has one per cluster.
    mine = (
        access.visible(user, Change)
        .select_related("cluster")
        .only("rollout", "cluster__name", "wave", "targets", "state", "error", "client_impact")
    )
    return rollouts.annotate(change_total=Count("changes")).prefetch_related(Prefetch("changes", queryset=mine))


def change_rows_seen_by(user, page: list[Rollout]) -> dict[int, list[dict]]:
    """For each rollout of a page, in one query: the changes the user may see as `seen_by`
    prefetches them (same rows, same order), as plain rows of what a rollout shows of each: a
    page of fleet-wide rollouts holds thousands of changes, and building a change and a cluster
    object for each cost most of the page."""
    rows: dict[int, list[dict]] = {rollout.pk: [] for rollout in page}
    if not rows:
        return rows
    read_totals(page)
    mine = access.visible(user, Change).filter(rollout__in=list(rows)).order_by(*Change._meta.ordering)
    fields = ("id", "rollout", "cluster", "cluster__name", "wave", "targets", "state", "error", "client_impact")
    for row in mine.values(*fields):
        rows[row["rollout"]].append(row)
    return rows


def error_seen_by(rollout: Rollout) -> str:
    """The rollout's error cut to the clusters whose changes were prefetched by `seen_by`."""
    changes = rollout.changes.all()
    return error_cut_to(rollout, {change.cluster.name for change in changes}, len(changes))


def error_cut_to(rollout: Rollout, clusters: set[str], seen: int) -> str:
    """The rollout's error as far as it concerns `clusters`, the clusters of the `seen` changes
    the user may see (of `rollout.change_total`). Each part of an error names its cluster first
    ("eu-prod: change #5 rolled back")."""
    if not rollout.error:
        return ""
    if seen == rollout.change_total:
        return rollout.error
    parts = [part for part in rollout.error.split("; ") if part.split(":", 1)[0] in clusters]
    return "; ".join(parts) or "The rollout stopped at a change on a cluster of another team."


def read_totals(page: list[Rollout]) -> None:
    """`change_total` on each rollout of a list page that stopped with an error, the only ones
    whose error is cut by it (`error_cut_to`), in one query. Counting every rollout's changes in
    the list's own query grouped all the page's changes, in the paginator's count as well."""
    failed = [rollout for rollout in page if rollout.error and not hasattr(rollout, "change_total")]
    if not failed:
        return
    counted = Change.objects.filter(rollout__in=failed).order_by().values("rollout").annotate(n=Count("*"))
    totals = {row["rollout"]: row["n"] for row in counted}
    for rollout in failed:
        rollout.change_total = totals.get(rollout.pk, 0)


def summaries(user, page: list[Rollout]) -> dict[int, tuple[dict[str, int], str]]:
    """For each rollout of a page, in at most three queries whatever the rollouts' size: how many of the
    changes the user may see are in each state, and its error as far as it concerns them."""
    read_totals(page)
    mine = access.visible(user, Change).filter(rollout__in=page)
    counts: dict[int, dict[str, int]] = {rollout.pk: {} for rollout in page}
    for row in mine.order_by().values("rollout", "state").annotate(n=Count("*")):
        counts[row["rollout"]][row["state"]] = row["n"]
    clusters: dict[int, set[str]] = {rollout.pk: set() for rollout in page}
    partial = [r for r in page if r.error and sum(counts[r.pk].values()) != r.change_total]
    for rollout_id, name in mine.filter(rollout__in=partial).values_list("rollout", "cluster__name") if partial else ():
        clusters[rollout_id].add(name)
    return {
        rollout.pk: (counts[rollout.pk], error_cut_to(rollout, clusters[rollout.pk], sum(counts[rollout.pk].values())))
        for rollout in page
    }
