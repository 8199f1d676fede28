"""LLM serving on Ray Serve (`ray.serve.llm` on vLLM): recognising its deployments and planning GPU memory.

Pure functions over config dicts; no models, no network. See docs/llm.md for the planner's formulas.
"""
