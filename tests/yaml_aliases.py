"""YAML whose aliases multiply: each level a list of `width` aliases to the level below, so a few
hundred characters stand for width ** levels strings once anything walks the value."""

from __future__ import annotations

import json


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """A flow mapping `{l0: &l0 [...], l1: &l1 [*l0, ...], ...}`: nine levels of nine are 387 million strings."""
    entries = [f"l0: &l0 [{', '.join(['x'] * width)}]"]
    entries += [f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * width)}]" for n in range(1, levels)]
    return "{" + ", ".join(entries) + "}"


def written_out(levels: int = 2, width: int = 3) -> str:
    """What `alias_bomb(levels, width)` stands for, written out (as JSON, which is YAML)."""
    value, mapping = "x", {}
    for n in range(levels):
        value = [value] * width
        mapping[f"l{n}"] = value
    return json.dumps(mapping)
