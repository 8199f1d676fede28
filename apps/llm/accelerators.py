"""GPU memory by Ray accelerator type (the names in `ray.util.accelerators`, which `LLMConfig.accelerator_type` takes).

vLLM sizes everything from the device's total as CUDA reports it (`torch.cuda.mem_get_info`, taken in
`Worker.init_device`, vllm/v1/worker/gpu_worker.py), which is less than the board's memory: the driver keeps a
part for itself. vLLM prints that total in its start-up log ("total_gpu_memory (79.19GiB)" before 0.9,
"Total GPU memory" later). Where such a log was read, the table holds its figure; elsewhere it holds the
board's `nvidia-smi` total less the most CUDA kept on the boards that were read (1.75 %), and says so.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 2**20
GIB = 2**30
# The share of the nvidia-smi total that CUDA did not report on the boards whose vLLM logs were read (H100: 79.19 of
# 79.65 GiB, 0.6 %; A100: 39.39 of 40 GiB, 1.5 %, and 79.15 of 80 GiB, 1.1 %; RTX 3090: 23.58 of 24 GiB, 1.75 %), the
# top of that range: a board without a log is planned with the least memory the others suggest.
_CUDA_RESERVE = 0.0175


@dataclass(frozen=True)
class Accelerator:
    name: str
    memory_bytes: int  # the total CUDA reports, which vLLM's gpu_memory_utilization multiplies
    source: str

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB

    @property
    def is_a100(self) -> bool:
        # vLLM keeps A100s on the small batch defaults whatever their memory (EngineArgs.get_batch_defaults).
        return self.name.upper().startswith("A100")


class UnknownAccelerator(ValueError):
    """The accelerator's memory is not known: the caller has to ask for it."""


# name: (CUDA total in GiB or None, nvidia-smi MiB, board, where the CUDA figure comes from)
_KNOWN: dict[str, tuple[float | None, int, str, str]] = {
    "T4": (None, 15_360, "Tesla T4 16 GB", ""),
    "V100": (None, 16_160, "V100 16 GB (Ray also calls the 32 GB board V100)", ""),
    "A10G": (None, 23_028, "A10G 24 GB (AWS g5)", ""),
    "L4": (None, 23_034, "L4 24 GB", ""),
    "L40S": (None, 46_068, "L40S 48 GB", ""),
    "A100": (39.39, 40_960, "A100 40 GB (Ray also calls the 80 GB board A100; A100-80G names it)", "vLLM logs"),
    "A100-40G": (39.39, 40_960, "A100 40 GB", "vLLM logs"),
    "A100-80G": (79.15, 81_920, "A100 80 GB", "vLLM logs"),
    "H100": (79.19, 81_559, "H100 80 GB (the H100 NVL has 94 GB)", "vLLM 0.19 logs"),
    "H200": (None, 143_771, "H200 141 GB", ""),
}

# serve.llm turns "A10" into "A10G" (LLMConfig.validate_accelerator_type in
# ray/llm/_internal/serve/core/configs/llm_config.py).
_ALIASES = {"A10": "A10G"}

KNOWN_ACCELERATORS = tuple(_KNOWN)


def cuda_total(name: str) -> tuple[int, str]:
    """The total CUDA reports for a known board, and where the figure comes from."""
    gib, smi_mib, board, seen = _KNOWN[name]
    if gib is not None:
        return round(gib * GIB), f"{name}: {gib:.2f} GiB, the total CUDA reports on the {board} ({seen})"
    total = int(smi_mib * MIB * (1 - _CUDA_RESERVE)) // MIB * MIB
    return total, (
        f"{name}: {total / GIB:.2f} GiB, the {smi_mib:,} MiB nvidia-smi shows for the {board} less the "
        f"{_CUDA_RESERVE:.1%} CUDA keeps"
    )


def accelerator(
    accelerator_type: str | None, memory_gib: float | None = None, *, memory_bytes: int | None = None
) -> Accelerator:
    """The accelerator's memory: the one given wins over the table; an unknown type asks for it."""
    name = _ALIASES.get(accelerator_type or "", accelerator_type)
    if memory_bytes is None and memory_gib is not None:
        if memory_gib <= 0:
            raise ValueError(f"GPU memory must be positive, got {memory_gib} GiB")
        memory_bytes = round(memory_gib * GIB)
    if memory_bytes is not None:
        if memory_bytes <= 0:
            raise ValueError(f"GPU memory must be positive, got {memory_bytes} bytes")
        return Accelerator(name or "unspecified", memory_bytes, f"{memory_bytes / GIB:.2f} GiB, as given")
    if not name:
        raise UnknownAccelerator(
            "the deployment names no accelerator_type: give the GPU memory size in GiB to plan its memory"
        )
    if name not in _KNOWN:
        raise UnknownAccelerator(
            f"Fleetdeck does not know the memory of accelerator type {name!r}: give the GPU memory size in GiB "
            f"(known types: {', '.join(KNOWN_ACCELERATORS)})"
        )
    total, source = cuda_total(name)
    return Accelerator(name, total, source)
