"""GPU memory by Ray accelerator type (the names in `ray.util.accelerators`, which `LLMConfig.accelerator_type` takes).

vLLM sizes everything from the device's total memory as CUDA reports it (`torch.cuda.mem_get_info`, see
`Worker.init_device` in vllm/v1/worker/gpu_worker.py), not from the marketed capacity, so the table holds the
total that `nvidia-smi` shows for each board; CUDA's figure differs from it by well under 1 %.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 2**20
GIB = 2**30


@dataclass(frozen=True)
class Accelerator:
    name: str
    memory_bytes: int
    source: str

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB


class UnknownAccelerator(ValueError):
    """The accelerator's memory is not known: the caller has to ask for it."""


# Ray's own names; where Ray uses one name for several boards, the smaller board is assumed, because
# planning for less memory than the GPU has leaves room unused but never OOMs.
_KNOWN_MIB: dict[str, tuple[int, str]] = {
    "T4": (15_360, "Tesla T4 16 GB"),
    "V100": (16_160, "V100 16 GB (Ray also calls the 32 GB board V100)"),
    "A10G": (23_028, "A10G 24 GB (AWS g5)"),
    "L4": (23_034, "L4 24 GB"),
    "L40S": (46_068, "L40S 48 GB"),
    "A100": (40_960, "A100 40 GB (Ray also calls the 80 GB board A100; A100-80G names it)"),
    "A100-40G": (40_960, "A100 40 GB"),
    "A100-80G": (81_920, "A100 80 GB"),
    "H100": (81_559, "H100 80 GB (the H100 NVL has 94 GB)"),
    "H200": (143_771, "H200 141 GB"),
}

# serve.llm turns "A10" into "A10G" (LLMConfig.validate_accelerator_type in
# ray/llm/_internal/serve/core/configs/llm_config.py).
_ALIASES = {"A10": "A10G"}

KNOWN_ACCELERATORS = tuple(_KNOWN_MIB)


def accelerator(accelerator_type: str | None, memory_gib: float | None = None) -> Accelerator:
    """The accelerator's memory: the one given wins over the table; an unknown type asks for it."""
    name = _ALIASES.get(accelerator_type or "", accelerator_type)
    if memory_gib is not None:
        if memory_gib <= 0:
            raise ValueError(f"GPU memory must be positive, got {memory_gib} GiB")
        return Accelerator(name or "unspecified", round(memory_gib * GIB), f"{memory_gib:g} GiB, as given")
    if not name:
        raise UnknownAccelerator(
            "the deployment names no accelerator_type: give the GPU memory size in GiB to plan its memory"
        )
    if name not in _KNOWN_MIB:
        raise UnknownAccelerator(
            f"Fleetdeck does not know the memory of accelerator type {name!r}: give the GPU memory size in GiB "
            f"(known types: {', '.join(KNOWN_ACCELERATORS)})"
        )
    mib, board = _KNOWN_MIB[name]
    return Accelerator(name, mib * MIB, f"{name}: {mib:,} MiB, the total nvidia-smi shows for the {board}")
