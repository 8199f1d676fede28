"""The LLM memory planner against real vLLM start-ups: predicted KV tokens against logged, for every record.

    .venv/bin/python bench/llm_planner.py

Each record in tests/fixtures/llm/startup_logs is a start-up vLLM logged on a real GPU (the file names its public
source). The baseline is vLLM's own figure: a ratio of 1.000 is exact, the band the tests hold is 0.90-1.03.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from apps.llm.startup_log import HIGH, LOW, load  # noqa: E402


def main() -> int:
    records = load(ROOT / "tests" / "fixtures" / "llm" / "startup_logs")
    print(f"{'record':<52} {'logged':>11} {'predicted':>11} {'ratio':>6} {'conc. logged':>12} {'predicted':>9}")
    outside = 0
    ratios = []
    for record in records:
        plan = record.predict()
        predicted = int(plan.kv_cache_tokens.value)
        ratio = predicted / record.logged_tokens
        ratios.append(ratio)
        flag = "" if LOW <= ratio <= HIGH else "  OUTSIDE"
        outside += bool(flag)
        logged_conc = record.logged_concurrency
        conc = f"{logged_conc:.2f}x" if logged_conc else "-"
        print(
            f"{record.name:<52} {record.logged_tokens:>11,} {predicted:>11,} {ratio:>6.3f} {conc:>12} "
            f"{plan.max_concurrency.value:>8.2f}x{flag}"
        )
    print(
        f"\n{len(records)} records; ratio to vLLM's logged KV tokens: min {min(ratios):.3f}, max {max(ratios):.3f}; "
        f"{outside} outside {LOW:.2f}-{HIGH:.2f}"
    )
    return 1 if outside else 0


if __name__ == "__main__":
    sys.exit(main())
