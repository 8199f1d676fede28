"""How vLLM lays its KV cache out over layers, and what it logs: blocks, tokens and concurrency.

Read in vllm/v1/core/kv_cache_utils.py and vllm/v1/kv_cache_interface.py of each release: a layer's page holds
`block_size` tokens of K and V; layers of one attention type form groups of equal size (hybrid models), all groups
draw blocks from one pool, and a request needs blocks in every group (a sliding-window group only for its window).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from apps.llm.vllm_versions import Accounting


@dataclass(frozen=True)
class Group:
    window: int | None  # None: full attention
    layers: int  # layers in the group, padding included


@dataclass(frozen=True)
class Layout:
    groups: tuple[Group, ...]
    group_size: int  # layers whose pages make one block of the pool
    page_bytes: int  # one layer's page: block_size tokens of K and V
    block_size: int
    padding_layers: int

    @property
    def bytes_per_block(self) -> int:
        return self.page_bytes * self.group_size

    @property
    def hybrid(self) -> bool:
        return len(self.groups) > 1 or any(g.window for g in self.groups)


def layout(windows: list[int | None], page_bytes: int, block_size: int, vllm: Accounting) -> Layout:
    """The groups one worker's layers form (windows: each layer's sliding window or None)."""
    kinds: dict[int | None, int] = {}
    for window in windows:
        kinds[window] = kinds.get(window, 0) + 1
    if len(kinds) == 1 or not vllm.hybrid_kv_groups:
        # One type, or a release without the grouped allocator: every layer is one page of one block, and
        # sliding-window layers are sized as full attention (unify_hybrid_kv_cache_specs).
        window = next(iter(kinds)) if len(kinds) == 1 and vllm.hybrid_kv_groups else None
        return Layout((Group(window, len(windows)),), len(windows), page_bytes, block_size, 0)
    smallest, largest = min(kinds.values()), max(kinds.values())
    size = smallest
    if vllm.group_size_slack and largest < smallest * vllm.group_size_slack:
        size = largest
    groups: list[Group] = []
    padding = 0
    for window, count in kinds.items():
        for _ in range(math.ceil(count / size)):
            groups.append(Group(window, size))
        padding += math.ceil(count / size) * size - count
    return Layout(tuple(groups), size, page_bytes, block_size, padding)


def blocks(layout: Layout, available_bytes: float) -> int:
    """num_blocks: the pool's memory over one block of every group's layer slot (get_num_blocks)."""
    return max(0, int(available_bytes // layout.bytes_per_block))


def blocks_per_request(layout: Layout, max_model_len: int, max_num_batched_tokens: int) -> int:
    """Blocks one max_model_len request holds across the groups (max_memory_usage_bytes / page)."""
    total = 0
    for group in layout.groups:
        if group.window:
            # SlidingWindowSpec: the window less one, plus the tokens scheduled in one step, plus a block of slack.
            tokens = min(group.window - 1 + max_num_batched_tokens, max_model_len)
            total += math.ceil(tokens / layout.block_size) + 1
        else:
            total += math.ceil(max_model_len / layout.block_size)
    return total


def concurrency(layout: Layout, num_blocks: int, max_model_len: int, max_num_batched_tokens: int) -> float:
    return num_blocks / blocks_per_request(layout, max_model_len, max_num_batched_tokens)


def logged_tokens(
    layout: Layout, num_blocks: int, max_model_len: int, max_num_batched_tokens: int, vllm: Accounting
) -> int:
    """The "GPU KV cache size: N tokens" vLLM logs."""
    if vllm.tokens_from_concurrency:
        return int(concurrency(layout, num_blocks, max_model_len, max_num_batched_tokens) * max_model_len)
    return num_blocks // len(layout.groups) * layout.block_size


def fit_model_len(layout: Layout, num_blocks: int, max_model_len: int, max_num_batched_tokens: int) -> int:
    """The longest max_model_len whose one request fits the pool (vLLM's auto-fit for max_model_len=-1)."""
    usable = num_blocks - 1  # the null block BlockPool holds back
    if blocks_per_request(layout, 1, max_num_batched_tokens) > usable:
        return 0
    low, high = 1, max_model_len
    while low < high:
        mid = (low + high + 1) // 2
        if blocks_per_request(layout, mid, max_num_batched_tokens) <= usable:
            low = mid
        else:
            high = mid - 1
    return low
