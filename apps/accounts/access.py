"""Object-level access in one place: which rows of a team-owned model a user may see, fetching
one of them or answering 404, and refusing what the user's role in the row's team does not allow.

Pages, API viewsets and serializer fields all ask here, so the UI and the API cannot disagree,
and another team's object is always answered exactly like one that does not exist (404, or for a
reference in a request body the same 400 as an unknown id): its existence is never confirmed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import reduce

from django.core.exceptions import ImproperlyConfigured, PermissionDenied, ValidationError
from django.db.models import Model, Q, QuerySet
from django.http import Http404
from django.shortcuts import get_object_or_404

from apps.accounts.models import AuditEvent, Role, Team
from apps.accounts.permissions import User, has_role, team_ids


def _audit_events(user: User, teams: QuerySet) -> Q:
    """A team's log is for its admins; everyone sees what they did themselves."""
    if user.is_superuser:
        return Q()
    return Q(team__in=team_ids(user, Role.ADMIN)) | Q(actor=user)


def _rule(model: type[Model]) -> Callable[[User, QuerySet], Q] | None:
    """For rows that are not simply "in one of the teams": a model says so with `visible_rows`."""
    if model is AuditEvent:
        return _audit_events
    return getattr(model, "visible_rows", None)


def _queryset(rows: QuerySet | type[Model]) -> QuerySet:
    return rows._default_manager.all() if isinstance(rows, type) else rows


def _team_path(model: type[Model]) -> str:
    # Each team-owned model says how it reaches its team; one without a path cannot be asked
    # about, so a new model forces the question.
    path = getattr(model, "team_path", None)
    if path is None:
        raise ImproperlyConfigured(f"Give {model._meta.label_lower} a team_path: how a row of it belongs to a team.")
    return path


def visible(user: User, rows: QuerySet | type[Model], *, role: Role = Role.VIEWER) -> QuerySet:
    """The rows in teams where the user holds at least `role` (any membership by default)."""
    queryset = _queryset(rows)
    if user is None or not user.is_authenticated:
        return queryset.none()
    teams = team_ids(user, role)
    rule = _rule(queryset.model)
    if rule is not None:
        return queryset.filter(rule(user, teams))
    path = _team_path(queryset.model)
    return queryset.filter(**{f"{path}__in" if path else "pk__in": teams})


def team_of(obj: Model) -> Team | None:
    """The team that owns `obj` (None for a built-in preset or a team-less audit event)."""
    path = _team_path(type(obj))
    return reduce(getattr, path.split("__"), obj) if path else obj


def require(user: User, team: Team | None, needed: Role, what: str = "") -> None:
    """403 unless the user holds `needed` in `team`. Raised as Django's PermissionDenied, which
    pages render as 403 and DRF answers as 403 with the same message."""
    if not has_role(user, team, needed):
        raise PermissionDenied(
            f"You need the {needed.label.lower()} role in team {team}{f' to {what}' if what else ''}."
        )


@dataclass(frozen=True)
class Permission:
    """A named rule for one operation: the role it needs in the object's team, and how a refusal
    names it. A page and the API endpoint of the same operation demand the same one."""

    role: Role
    what: str


def demand(user: User, team: Team | None, permission: Permission) -> None:
    require(user, team, permission.role, permission.what)


def get_visible_or_404(user: User, rows: QuerySet | type[Model], **lookup) -> Model:
    try:
        return get_object_or_404(visible(user, rows), **lookup)
    except (ValueError, ValidationError) as exc:  # a form's "abc" where an id belongs names nothing
        raise Http404("No such object.") from exc


def get_for(user: User, rows: QuerySet | type[Model], needed: Role, what: str = "", **lookup) -> Model:
    """The row if the user may see it (404 otherwise) and holds `needed` in its team (403
    otherwise): members learn what their role lacks, everyone else learns nothing."""
    obj = get_visible_or_404(user, rows, **lookup)
    require(user, team_of(obj), needed, what)
    return obj
