"""A vLLM start-up as recorded from a real GPU, and the planner's prediction of it.

A record (tests/fixtures/llm/startup_logs/*.json) holds the model's config.json, the GPU, the engine arguments,
the vLLM version and the figures vLLM logged ("GPU KV cache size: N tokens", "Maximum concurrency for N tokens
per request: X x", "Available KV cache memory"), with the public source they were read from. The planner is held
to them: its KV tokens may be a little low, never high (LOW, HIGH).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apps.llm.accelerators import accelerator
from apps.llm.planner import EngineSettings, MemoryPlan, plan_memory
from apps.llm.shapes import parse_hf_config
from apps.llm.vllm_versions import accounting

# The band a prediction must lie in, as a ratio to the logged KV tokens.
LOW, HIGH = 0.90, 1.03


@dataclass(frozen=True)
class Recorded:
    name: str
    data: dict[str, Any]

    @property
    def logged_tokens(self) -> int:
        return int(self.data["logged"]["kv_cache_tokens"])

    @property
    def logged_concurrency(self) -> float | None:
        return self.data["logged"].get("max_concurrency")

    @property
    def summary(self) -> str:
        d, engine = self.data, self.data["engine"]
        return (
            f"{d['model']['id']} on {d['gpu']['count']} x {d['gpu']['name']}, vLLM {d['vllm_version']}, "
            f"TP {engine['tensor_parallel_size']}"
        )

    def settings(self) -> EngineSettings:
        e = self.data["engine"]
        return EngineSettings(
            tensor_parallel_size=e.get("tensor_parallel_size") or 1,
            pipeline_parallel_size=e.get("pipeline_parallel_size") or 1,
            gpu_memory_utilization=e.get("gpu_memory_utilization"),
            max_model_len=e.get("max_model_len"),
            block_size=e.get("block_size"),
            max_num_seqs=e.get("max_num_seqs"),
            max_num_batched_tokens=e.get("max_num_batched_tokens"),
            enforce_eager=bool(e.get("enforce_eager")),
            kv_cache_dtype=e.get("kv_cache_dtype") or "auto",
            dtype=e.get("dtype") if e.get("dtype") not in (None, "auto") else None,
            offline=self.data.get("entrypoint") == "offline",
        )

    def predict(self) -> MemoryPlan:
        gpu = self.data["gpu"]
        device = accelerator(gpu.get("accelerator"), memory_bytes=gpu.get("memory_bytes"))
        vllm, source = accounting(self.data["vllm_version"])
        shape = parse_hf_config(self.data["model"]["config"])
        return plan_memory(shape, device, self.settings(), vllm=vllm, vllm_source=source)


def load(directory: Path) -> list[Recorded]:
    return [Recorded(path.stem, json.loads(path.read_text())) for path in sorted(directory.glob("*.json"))]
