"""Which vLLM a cluster runs, and how that vLLM accounts GPU memory at start.

The accounting changed between releases; each switch below was read in the release's own source distribution on
PyPI (vllm-<version>.tar.gz), the files named beside it. Versions between two read releases take the older
behaviour unless the switch says otherwise: a planner that assumes the older, less generous accounting errs on the
side of fewer KV tokens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


class UnknownVersion(ValueError):
    """A version string that is not a vLLM or Ray release number."""


Version = tuple[int, int, int]

# serve.llm's vLLM requirement in each Ray release's wheel metadata (`Requires-Dist: vllm... ; extra == "llm"`).
# From Ray 2.56 the extra pins one release; before it, a floor, which is the release Ray's images and CI ran.
RAY_VLLM: tuple[tuple[Version, Version, str], ...] = (
    ((2, 43, 0), (0, 7, 2), ">="),
    ((2, 45, 0), (0, 8, 2), ">="),
    ((2, 46, 0), (0, 8, 5), ">="),
    ((2, 48, 0), (0, 9, 2), ">="),
    ((2, 49, 0), (0, 10, 0), ">="),
    ((2, 50, 0), (0, 10, 2), ">="),
    ((2, 51, 0), (0, 11, 0), ">="),
    ((2, 53, 0), (0, 12, 0), ">="),
    ((2, 54, 0), (0, 15, 0), ">="),
    ((2, 55, 0), (0, 18, 0), ">="),
    ((2, 56, 0), (0, 22, 0), "=="),
    ((2, 57, 0), (0, 25, 1), "=="),
    ((2, 58, 0), (0, 26, 0), "=="),
    ((2, 59, 0), (0, 27, 0), "=="),
    ((2, 60, 0), (0, 29, 0), "=="),
)
# What the planner assumes when neither the user nor the cluster's Ray version says: the newest Ray's pin.
DEFAULT_VLLM: Version = RAY_VLLM[-1][1]
OLDEST_PLANNED: Version = (0, 8, 0)

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:[.+-].*)?$")


def parse_version(text: str) -> Version:
    match = _VERSION.match(str(text).strip())
    if not match:
        raise UnknownVersion(f"{text!r} is not a version number like 0.11.0")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def show(version: Version) -> str:
    return ".".join(map(str, version))


def vllm_for_ray(ray_version: str | None) -> tuple[Version, str]:
    """The vLLM that serve.llm runs on a Ray release, and where that comes from."""
    if not ray_version:
        return DEFAULT_VLLM, f"vLLM {show(DEFAULT_VLLM)}: no Ray version known, the newest Ray's pin assumed"
    ray = parse_version(ray_version)
    if ray < RAY_VLLM[0][0]:
        raise UnknownVersion(f"Ray {ray_version} predates serve.llm's vLLM engine (Ray {show(RAY_VLLM[0][0])})")
    pinned = [(since, vllm, op) for since, vllm, op in RAY_VLLM if since <= ray][-1]
    since, vllm, op = pinned
    how = "pins" if op == "==" else "requires at least"
    wheel = f"ray {show(since)}'s wheel metadata"
    return vllm, f"vLLM {show(vllm)}: Ray {ray_version}'s serve.llm {how} vllm {show(vllm)} ({wheel})"


@dataclass(frozen=True)
class Accounting:
    """How one vLLM release sizes its KV cache at start; every switch names the source that shows it."""

    version: Version

    @property
    def label(self) -> str:
        return f"vLLM {show(self.version)}"

    @property
    def non_torch_includes_context(self) -> bool:
        # 0.8.x: Worker.determine_available_memory subtracts everything CUDA holds outside torch, the CUDA context
        # included. 0.9 takes a baseline snapshot first and counts only the growth (vllm/utils memory_profiling).
        return self.version < (0, 9, 0)

    @property
    def nccl_before_snapshot(self) -> bool:
        # 0.11.0 moved init_worker_distributed_environment before the MemorySnapshot in Worker.init_device, so NCCL's
        # buffers sit outside the budget; 0.10.2 still took the snapshot first.
        return self.version >= (0, 11, 0)

    @property
    def cuda_graphs_in_budget(self) -> bool:
        # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to "1" from 0.20.0 (vllm/envs.py; 0.19.1 has "0"): the
        # estimate from profile_cudagraph_memory comes out of gpu_memory_utilization's budget.
        return self.version >= (0, 20, 0)

    @property
    def tokens_from_concurrency(self) -> bool:
        # 0.21.0 logs "GPU KV cache size" as int(max_concurrency * max_model_len) (kv_cache_utils.py); before, as
        # num_blocks // len(groups) * block_size.
        return self.version >= (0, 21, 0)

    @property
    def hybrid_kv_groups(self) -> bool:
        # _get_kv_cache_groups_uniform_page_size, the grouped (hybrid) allocator, is in 0.9.2's kv_cache_utils.py.
        return self.version >= (0, 9, 2)

    @property
    def group_size_slack(self) -> float | None:
        # Groups take the largest type's layer count when it is below min x slack: none in 0.11.0, 1.25 in
        # 0.12.0-0.16.0, 1.5 from 0.18.0 (kv_cache_utils.py).
        if self.version >= (0, 17, 0):
            return 1.5
        if self.version >= (0, 12, 0):
            return 1.25
        return None

    @property
    def auto_fit_model_len(self) -> bool:
        # max_model_len=-1 fits the context to the KV cache (_auto_fit_max_model_len): present in 0.14.0, absent in
        # 0.12.0.
        return self.version >= (0, 14, 0)

    @property
    def performance_mode(self) -> bool:
        # EngineArgs.performance_mode ("throughput" doubles the batch defaults): in 0.18.0's arg_utils.py, not 0.16.0's.
        return self.version >= (0, 18, 0)


def accounting(version: str | Version | None = None, *, ray_version: str | None = None) -> tuple[Accounting, str]:
    """The accounting of the vLLM given, else the one the Ray version pins; with where the version comes from."""
    if version:
        parsed = parse_version(version) if isinstance(version, str) else version
        source = f"vLLM {show(parsed)}, as given"
    else:
        parsed, source = vllm_for_ray(ray_version)
    if parsed < OLDEST_PLANNED:
        raise UnknownVersion(
            f"vLLM {show(parsed)} predates the V1 engine (0.8): this planner models V1's accounting only"
        )
    return Accounting(parsed), source
