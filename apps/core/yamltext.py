"""YAML for people to read, written by libyaml where PyYAML has it: the findings page writes a
patch per row, and PyYAML's pure-Python emitter was half of that page's time (the same text,
checked in tests/unit/core/test_yamltext.py)."""

from __future__ import annotations

import yaml

DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
# libyaml takes an integer line width; this one never folds.
NO_FOLDING = 2**31 - 1


def dump(value, **options) -> str:
    """`yaml.safe_dump(value, **options)`."""
    return yaml.dump(value, Dumper=DUMPER, **options)
