"""The "LLM capacity planner" page: a config.json and engine settings in, the KV cache and one GPU's memory out.

htmx posts the form and swaps the form and its answer in place; without JavaScript the same POST renders the page."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from apps.llm import capacity
from apps.llm.accelerators import GIB
from apps.llm.forms import PlannerForm

PAGE = "llm/planner.html"
PARTIAL = "llm/partials/planner.html"
# One GPU's memory, left to right: what vLLM's budget (gpu_memory_utilization x the GPU) holds, then what lies
# outside it (CUDA graphs too, for a vLLM that does not count them in the budget). Colours are SVG fill
# attributes, so the bar needs no stylesheet of its own.
PARTS = (
    ("weights", "Weights", "#2456d6"),
    ("activation_peak", "Activation peak", "#6b46c1"),
    ("cuda_graphs", "CUDA graphs", "#b7791f"),
    ("non_torch", "Non-torch memory", "#718096"),
    ("kv_cache", "KV cache", "#1d8a4e"),
    ("outside_budget", "Outside the budget (CUDA context)", "#97266d"),
    ("unused", "Unused", "#dde2e8"),
)
BAR_WIDTH = 1000


@login_required
def planner(request):
    form = PlannerForm(request.user, request.POST if request.method == "POST" else None)
    plan = None
    if form.is_bound and form.is_valid():
        try:
            plan = capacity.plan_capacity(form.payload())
        except capacity.PlanInputError as exc:
            form.refuse(exc)
    context = {"form": form, "plan": plan, "bar": memory_bar(plan["memory"]) if plan else None}
    return render(request, PARTIAL if request.htmx else PAGE, context)


def memory_bar(memory: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The parts of one GPU's memory as segments of an SVG bar BAR_WIDTH wide. When the parts add up to more
    than the GPU (a model that does not fit), the bar is drawn to their sum and a line marks the GPU's end."""
    total = memory["total"]["bytes"]
    parts = [part for part in PARTS if part[0] != "cuda_graphs"]
    graphs = next(part for part in PARTS if part[0] == "cuda_graphs")
    after = "activation_peak" if memory["cuda_graphs"].get("inside_budget", True) else "kv_cache"
    parts.insert(next(i for i, part in enumerate(parts) if part[0] == after) + 1, graphs)
    drawn = max(total, sum(memory[name]["bytes"] for name, _, _ in parts))
    scale = BAR_WIDTH / drawn if drawn > 0 else 0
    segments, x = [], 0.0
    for name, label, colour in parts:
        part = memory[name]
        width = part["bytes"] * scale
        segments.append(
            {
                "name": name,
                "label": label,
                "colour": colour,
                "x": round(x, 2),
                "width": round(width, 2),
                "gib": part["bytes"] / GIB,
                "share": part["bytes"] / total if total else 0,
                "source": part["source"],
            }
        )
        x += width
    return {
        "width": BAR_WIDTH,
        "segments": segments,
        "total_gib": total / GIB,
        "requested_gib": memory["requested"]["bytes"] / GIB,
        "requested_source": memory["requested"]["source"],
        "total_source": memory["total"]["source"],
        "budget_x": round(min(memory["requested"]["bytes"] * scale, BAR_WIDTH), 2),
        "total_x": round(total * scale, 2) if drawn > total else None,
    }
