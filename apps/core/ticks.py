"""The periodic tick's due work, registered by the apps that own it (in `AppConfig.ready()`).

A handler finds its due work, does what is quick inline and yields the jobs to send; the tick
sends each as it is yielded, so a handler's later steps run after its sends, as they were
written. Handlers run in the order of their `position`, not in the order apps happen to load:
due syncs go out before the reconciler looks at changes, rollouts advance after it, and so on.
Each handler runs on its own (apps.liveness.services.run_tick): one that raises is logged, counted
and shown on /healthz, and the others still run, since the tick is every team's periodic work."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from apps.core.jobs import Job

# A handler yields the jobs to send; a prune may return how many rows it deleted instead.
Handler = Callable[[], Iterable[Job] | int | None]

_handlers: dict[str, tuple[int, Handler]] = {}


def register(name: str, position: int, handler: Handler) -> None:
    """Registering a name again replaces its handler, so a second `ready()` adds nothing."""
    _handlers[name] = (position, handler)


def handlers() -> list[Handler]:
    return [handler for _, handler in named_handlers()]


def named_handlers() -> list[tuple[str, Handler]]:
    """(name, handler) in the order they run."""
    ordered = sorted(_handlers.items(), key=lambda item: item[1][0])
    return [(name, handler) for name, (_, handler) in ordered]
