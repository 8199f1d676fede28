"""Reasons, owned by other apps, not to disturb a deployment now. Maintenance asks before a
recycle; the apps that know a reason (an open incident) register it in their `AppConfig.ready()`,
so maintenance needs no import of them."""

from __future__ import annotations

from collections.abc import Callable

from apps.fleet.models import Deployment

Hold = Callable[[Deployment], str | None]

_holds: dict[str, Hold] = {}


def register(name: str, hold: Hold) -> None:
    """`hold` answers why `deployment` must be left alone now, or None. Registered again under the
    same name, it replaces the earlier one."""
    _holds[name] = hold


def reasons(deployment: Deployment) -> list[str]:
    return [reason for hold in _holds.values() if (reason := hold(deployment))]
