"""Links to many rows of one kind, reversed once."""

from __future__ import annotations

from collections.abc import Callable

from django.urls import reverse

# A key no row has: the reversed URL is cut around it.
PROBE = 918273645


def by_key(name: str) -> Callable[[int], str]:
    """`reverse(name, args=[key])` for a URL whose one argument is an `<int:...>` path converter,
    which writes any integer as its digits: a page of 125 findings reversed four URLs a row, a
    fifth of its time."""
    head, tail = reverse(name, args=[PROBE]).split(str(PROBE))
    return lambda key: f"{head}{int(key)}{tail}"
