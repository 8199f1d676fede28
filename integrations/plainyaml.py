"""YAML that people type or a cluster holds, loaded as plain data: the one loader for configs,
options and kubeconfigs, here because integrations may import no app while every app may import it.

An alias repeats a node without repeating its text: ten lines of nine aliases each to the line
above are a few hundred characters that become billions of nodes as soon as anything walks the
value (saving it as JSON, hashing a plan, validating it), so a length limit on the text does
nothing. No config needs them, so anchors and aliases are refused outright rather than counted."""

from __future__ import annotations

from typing import IO, Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError

ALIASES_REFUSED = "YAML anchors and aliases (&name / *name) are not accepted: write the values out."
# Far deeper than any config, and far shallower than Python's recursion limit, which the composer
# (two frames a level) and every later walk of the value would otherwise run into.
MAX_DEPTH = 100


class _PlainLoader(yaml.SafeLoader):
    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        if event.anchor is not None:
            raise ComposerError(None, None, ALIASES_REFUSED, event.start_mark)
        if self._depth >= MAX_DEPTH:
            raise ComposerError(None, None, f"Nested more than {MAX_DEPTH} levels deep.", event.start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load(stream: str | bytes | IO) -> Any:
    """`yaml.safe_load(stream)` without anchors or aliases; every refusal is a `yaml.YAMLError`."""
    try:
        return yaml.load(stream, Loader=_PlainLoader)
    except ValueError as exc:
        # The safe constructors let Python's own refusals through: an integer past Python's digit
        # limit, a date such as 2024-13-45.
        raise ConstructorError(None, None, str(exc), None) from exc
