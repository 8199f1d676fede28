"""The planner against real vLLM start-ups: each logged KV cache size, predicted within -10 % / +3 %.

The records (tests/fixtures/llm/startup_logs) were read from public logs of real GPUs; each names its source, the
model's config.json, the GPU, the engine arguments and the vLLM version. A prediction above the band advises a
setting vLLM refuses; one below wastes a little memory, which is the side to err on."""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.llm.shapes import parse_hf_config
from apps.llm.startup_log import HIGH, LOW, load
from apps.llm.vllm_versions import parse_version

RECORDS = load(Path(__file__).resolve().parents[2] / "fixtures" / "llm" / "startup_logs")


@pytest.mark.parametrize("record", RECORDS, ids=[r.name for r in RECORDS])
def test_predicted_kv_tokens_lie_in_the_band(record):
    plan = record.predict()
    ratio = plan.kv_cache_tokens.value / record.logged_tokens
    assert LOW <= ratio <= HIGH, (
        f"{record.summary}: predicted {plan.kv_cache_tokens.value:,.0f}, logged {record.logged_tokens:,}"
    )
    if record.logged_concurrency:
        assert plan.max_concurrency.value <= record.logged_concurrency * HIGH


def test_the_records_cover_what_the_accounting_depends_on():
    engines = [r.data["engine"] for r in RECORDS]
    configs = [r.data["model"]["config"] for r in RECORDS]
    versions = [parse_version(r.data["vllm_version"]) for r in RECORDS]
    assert len(RECORDS) >= 8
    assert all(r.data["source"]["url"] for r in RECORDS)
    assert any(e["tensor_parallel_size"] >= 2 for e in engines)
    assert any(e.get("enforce_eager") for e in engines)
    assert any(e.get("kv_cache_dtype") == "fp8" for e in engines)
    assert any("vision_config" in c for c in configs)
    assert any(c.get("num_key_value_heads") == c.get("num_attention_heads") for c in configs)  # no GQA
    assert any(c.get("num_key_value_heads", 0) < c.get("num_attention_heads", 0) for c in configs)  # GQA
    assert any(v < (0, 21, 0) for v in versions) and any(v >= (0, 21, 0) for v in versions)
    assert any(parse_hf_config(c).sliding_layers for c in configs)  # interleaved sliding-window attention
