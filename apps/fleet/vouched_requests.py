"""Requests an operator already vouched for, by application. A calibration sends one when it is
given none; the app that keeps such requests (maintenance's warmup profiles) registers its source
in its `AppConfig.ready()`, so calibration needs no import of it."""

from __future__ import annotations

from collections.abc import Callable

from apps.fleet.models import Application

# A source answers the application's first vouched request as
# {"method", "path", "headers", "body"} (path under the route prefix, body None for none), or None.
Source = Callable[[Application], dict | None]

_sources: dict[str, Source] = {}
# A mix source answers every vouched request of the application, each with a "weight" (how many of
# it the operator sends), in a stable order; [] for none.
MixSource = Callable[[Application], list[dict]]
_mix_sources: dict[str, MixSource] = {}


def register(name: str, source: Source) -> None:
    """Registered again under the same name, a source replaces the earlier one."""
    _sources[name] = source


def first(application: Application) -> dict | None:
    for source in _sources.values():
        if (request := source(application)) is not None:
            return request
    return None


def register_mix(name: str, source: MixSource) -> None:
    _mix_sources[name] = source


def all_of(application: Application) -> list[dict]:
    """Every vouched request of the application, from the first source that has any."""
    for source in _mix_sources.values():
        if requests := source(application):
            return requests
    return []
