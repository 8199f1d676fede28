"""The model configs of tests/fixtures/llm, parsed."""

from __future__ import annotations

import json
from pathlib import Path

from apps.llm.shapes import ModelShape, parse_hf_config

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "llm"


def config(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.config.json").read_text())


def shape(name: str, **kwargs) -> ModelShape:
    return parse_hf_config(config(name), **kwargs)


LLAMA3_8B = "meta-llama-3-8b"
QWEN25_32B = "qwen2.5-32b-instruct"
MIXTRAL_8X7B = "mixtral-8x7b-v0.1"
QWEN15_MOE = "qwen1.5-moe-a2.7b"
