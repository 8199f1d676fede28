"""libyaml writes the text PyYAML's own emitter writes, for the values the pages show."""

from __future__ import annotations

import pytest
import yaml

from apps.core import yamltext

VALUES = [
    {"max_ongoing_requests": 2},
    {"num_replicas": 1, "autoscaling_config": None},
    {"autoscaling_config": {"min_replicas": 2, "target_ongoing_requests": 1.5, "upscale_delay_s": 0}},
    {"ray_actor_options": {"num_gpus": 1, "resources": {"x": "ünï ✓"}}, "user_config": {"prompt": "a: b # c"}},
    {"list": [1, "two", None, True], "long": "x " * 300, "on": "off", "empty": "", "big": 1e20, "neg": -1},
]


def test_libyaml_is_there():
    assert yamltext.DUMPER is yaml.CSafeDumper


@pytest.mark.parametrize("value", VALUES)
def test_the_same_text_as_pyyaml(value):
    assert yamltext.dump(value, sort_keys=False) == yaml.safe_dump(value, sort_keys=False)
    flow = {"default_flow_style": True, "sort_keys": False, "allow_unicode": True}
    assert yamltext.dump(value, width=yamltext.NO_FOLDING, **flow) == yaml.safe_dump(value, width=float("inf"), **flow)


@pytest.mark.parametrize("value", VALUES)
def test_load_reads_back_what_dump_wrote(value):
    assert yamltext.load(yamltext.dump(value, sort_keys=False)) == value
