"""Typed environment helpers that refuse bad values instead of guessing."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class ImproperEnv(ValueError):
    pass


def _read(name: str, default: T, parse: Callable[[str], T]) -> T:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return parse(raw.strip())
    except ValueError as exc:
        raise ImproperEnv(f"{name}={raw!r} is not valid: {exc}") from exc


def env_str(name: str, default: str = "") -> str:
    return _read(name, default, str)


def _parse_bool(raw: str) -> bool:
    lowered = raw.lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ValueError("expected one of 1/0, true/false, yes/no, on/off")


def env_bool(name: str, default: bool) -> bool:
    return _read(name, default, _parse_bool)


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    value = _read(name, default, int)
    if minimum is not None and value < minimum:
        raise ImproperEnv(f"{name}={value} must be at least {minimum}")
    return value


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    value = _read(name, default, float)
    if minimum is not None and value < minimum:
        raise ImproperEnv(f"{name}={value} must be at least {minimum}")
    return value


def env_list(name: str, default: list[str] | None = None) -> list[str]:
    return _read(name, default or [], lambda raw: [item.strip() for item in raw.split(",") if item.strip()])
