"""A tiny byte-level language model with seeded random weights, and the batch step the
reference Serve application runs.

Nothing is downloaded: the weights come from a fixed seed, so every replica and every
calibration run holds the same model and greedy generation is deterministic. The model is a
real decoder (two transformer blocks with a key/value cache), small enough for a CPU core, so
its memory grows with the tokens in a batch the way a large model's does, only smaller; the
configurable per-token and per-request temporaries stand in for the rest of a large model's
activation memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

VOCAB = 256
SEED = 20240611
# Output is limited to printable ASCII so that responses stay short, plain JSON strings.
PRINTABLE = range(32, 127)


@dataclass(frozen=True)
class Request:
    prompt: bytes
    max_tokens: int

    @property
    def tokens(self) -> int:
        return len(self.prompt) + self.max_tokens


def batch_token_sum(requests: list[Request]) -> int:
    return sum(request.tokens for request in requests)


def pick_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))

    def forward(self, x, keys, values, start: int, mask) -> torch.Tensor:
        """`x` holds the tokens for cache slots start…; their keys and values are written into
        the preallocated `keys` and `values` before attending over every slot so far."""
        n, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(n, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        keys[:, :, start : start + t] = k
        values[:, :, start : start + t] = v
        attended = F.scaled_dot_product_attention(q, keys[:, :, : start + t], values[:, :, : start + t], attn_mask=mask)
        x = x + self.out(attended.transpose(1, 2).reshape(n, t, d))
        return x + self.ff(self.norm2(x))


class ByteLM(nn.Module):
    def __init__(self, d_model: int = 128, n_heads: int = 4, n_layers: int = 2, d_ff: int = 512) -> None:
        super().__init__()
        self.d_model = d_model
        self.n_heads = n_heads
        self.embed = nn.Embedding(VOCAB, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, d_ff) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, VOCAB)

    def positions(self, index: torch.Tensor) -> torch.Tensor:
        # Sinusoidal rather than learned: no position table caps how long an uncapped
        # (misbehaving) request may be.
        half = self.d_model // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=index.device) / half)
        angles = index.unsqueeze(-1).float() * freqs
        return torch.cat([angles.sin(), angles.cos()], dim=-1)

    def step(self, tokens, index, caches, start: int, mask) -> torch.Tensor:
        """Run `tokens` (at cache slots start…) through the model; logits of the last slot."""
        x = self.embed(tokens) + self.positions(index)
        for block, (keys, values) in zip(self.blocks, caches, strict=True):
            x = block(x, keys, values, start, mask)
        return self.head(self.norm(x[:, -1]))


def build_model(device: torch.device | None = None) -> ByteLM:
    # A private RNG stream: building the model must not move anybody else's torch seed.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = ByteLM()
    return model.to(device or pick_device()).eval()


@torch.inference_mode()
def generate(model: ByteLM, requests: list[Request]) -> list[bytes]:
    """Greedy decoding of a batch. Prompts are left-padded so every row decodes in step; each
    row keeps only its own `max_tokens`."""
    device = next(model.parameters()).device
    n = len(requests)
    # An empty prompt still needs one token to condition on.
    prompts = [request.prompt or b"\n" for request in requests]
    width = max(len(prompt) for prompt in prompts)
    steps = max(request.max_tokens for request in requests)
    pads = torch.tensor([width - len(prompt) for prompt in prompts], device=device)
    tokens = torch.zeros(n, width, dtype=torch.long, device=device)
    for row, prompt in enumerate(prompts):
        tokens[row, width - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)

    head_dim = model.d_model // model.n_heads
    slots = width + steps
    caches = [
        (
            torch.zeros(n, model.n_heads, slots, head_dim, device=device),
            torch.zeros(n, model.n_heads, slots, head_dim, device=device),
        )
        for _ in model.blocks
    ]
    only_printable = torch.full((VOCAB,), float("-inf"), device=device)
    only_printable[PRINTABLE.start : PRINTABLE.stop] = 0.0
    slot = torch.arange(slots, device=device)
    key_is_token = slot.unsqueeze(0) >= pads.unsqueeze(1)  # [n, slots]
    index = (slot.unsqueeze(0) - pads.unsqueeze(1)).clamp(min=0)

    causal = slot[:width].unsqueeze(1) >= slot[:width].unsqueeze(0)
    # A padding slot attends to itself: a row with nothing to attend to would turn into NaN
    # and poison the real tokens through the cache.
    diagonal = torch.eye(width, dtype=torch.bool, device=device)
    mask = (causal & key_is_token[:, None, :width]) | diagonal
    logits = model.step(tokens, index[:, :width], caches, 0, mask.unsqueeze(1))

    generated = torch.empty(n, steps, dtype=torch.long, device=device)
    for step in range(steps):
        generated[:, step] = next_tokens = (logits + only_printable).argmax(dim=-1)
        if step + 1 == steps:
            break
        at = width + step
        mask = key_is_token[:, None, None, : at + 1]
        logits = model.step(next_tokens.unsqueeze(1), index[:, at : at + 1], caches, at, mask)

    rows = generated.cpu().tolist()
    return [bytes(row[: request.max_tokens]) for row, request in zip(rows, requests, strict=True)]


def warm_up(model: ByteLM) -> None:
    """A first batch through every code path (prefill with padding, decode steps), so that
    lazy initialisation in torch is paid before real traffic and measurements."""
    generate(model, [Request(b"warm up", 8), Request(b"before the first request", 8)])


def touch_temporaries(
    requests: list[Request], *, kb_per_token: int, mb_per_request: int, device: torch.device
) -> torch.Tensor | None:
    """Allocate and fill the per-batch working memory a large model would need for these
    requests. Filled, not just reserved: untouched pages never count against a node's memory."""
    size = batch_token_sum(requests) * kb_per_token * 1024 + len(requests) * mb_per_request * 1024 * 1024
    if size == 0:
        return None
    return torch.ones(size, dtype=torch.uint8, device=device)


def run_batch(model: ByteLM, requests: list[Request], *, kb_per_token: int = 0, mb_per_request: int = 0) -> list[bytes]:
    """One batch as a replica runs it: the temporaries stay alive for the whole generation,
    which is when a real model's activations and cache are alive too."""
    device = next(model.parameters()).device
    scratch = touch_temporaries(requests, kb_per_token=kb_per_token, mb_per_request=mb_per_request, device=device)
    texts = generate(model, requests)
    del scratch
    return texts
