"""YAML text in and out. Out: for people to read, written by libyaml where PyYAML has it: the
findings page writes a patch per row, and PyYAML's pure-Python emitter was half of that page's time
(the same text, checked in tests/unit/core/test_yamltext.py). In: what people type, loaded by the
loader the Kubernetes integration uses for clusters' text too (`integrations.plainyaml`)."""

from __future__ import annotations

import yaml

from integrations import plainyaml

DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
# libyaml takes an integer line width; this one never folds.
NO_FOLDING = 2**31 - 1


def dump(value, **options) -> str:
    """`yaml.safe_dump(value, **options)`."""
    return yaml.dump(value, Dumper=DUMPER, **options)


def load(text: str):
    """`yaml.safe_load(text)` without anchors or aliases, nested at most `plainyaml.MAX_DEPTH`
    levels; a refusal is a `yaml.YAMLError` that says what to write instead."""
    return plainyaml.load(text)
