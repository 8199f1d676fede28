"""The periodic tick's due work, registered by the apps that own it (in `AppConfig.ready()`).

A handler finds its due work, does what is quick inline and yields the jobs to send; the tick
sends each as it is yielded, so a handler's later steps run after its sends, as they were
written. Handlers run in the order of their `position`, not in the order apps happen to load:
due syncs go out before the reconciler looks at changes, rollouts advance after it, and so on.
An exception in one handler ends the tick, as it always did: the next tick starts over."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from apps.core.jobs import Job

Handler = Callable[[], Iterable[Job] | None]

_handlers: dict[str, tuple[int, Handler]] = {}


def register(name: str, position: int, handler: Handler) -> None:
    """Registering a name again replaces its handler, so a second `ready()` adds nothing."""
    _handlers[name] = (position, handler)


def handlers() -> list[Handler]:
    return [handler for _, handler in sorted(_handlers.values(), key=lambda entry: entry[0])]
