"""The type check's gate: mypy's errors against the committed mypy-baseline.txt, which may only shrink.

    .venv/bin/python scripts/mypy_baseline.py                 # `make typecheck`: fails on any difference
    .venv/bin/python scripts/mypy_baseline.py --update        # drop the entries that were fixed
    .venv/bin/python scripts/mypy_baseline.py --accept-new    # rewrite it whole, new errors included

An entry is "path: error-code: message", without the line number, so an edit elsewhere in a file does
not churn the baseline; entries are counted, so a second identical error in one file is new. The check
fails on a new error, and also on an entry that no longer occurs: left in, it would let the same error
come back unseen, so a fix shrinks the baseline in the same commit (`--update` does it). `--accept-new`
grows it, and is for a deliberate, reviewed reason only (an upgrade of mypy or of the stubs).

The domain modules (DOMAIN) may have no entry at all: their errors are fixed, never baselined.
Kept standalone (the standard library and mypy) so the unit tests import its comparison without mypy running.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / "mypy-baseline.txt"

# The modules that hold the decisions, and the vendor clients: issue 35 asks them to pass with no
# baseline entry. fnmatch patterns on the path mypy prints ("*" also crosses "/").
DOMAIN = (
    "apps/*/services.py",
    "apps/*/sizing.py",
    "apps/*/plan_choice.py",
    "apps/*/measurements.py",
    "apps/*/verification.py",
    "apps/*/protocol.py",
    "apps/*/planner.py",
    "apps/llm/*",
    "integrations/*",
)

# Domain modules allowed baseline entries for now, each with why. Only ever removed from: an entry
# here is a domain module that still has to be fixed.
PENDING: dict[str, str] = {}

HEADER = (
    "# mypy errors accepted for now: `path: error-code: message`, one per occurrence. It may only shrink:\n"
    "# fix an error and run `.venv/bin/python scripts/mypy_baseline.py --update` (CONTRIBUTING.md, Types).\n"
)

# path:line[:column]: error: message  [code]   (a file-level error has no line)
_ERROR = re.compile(r"^(?P<path>[^:\n]+?):(?:\d+:)?(?:\d+:)? error: (?P<message>.*?)(?:  \[(?P<code>[a-z0-9-]+)\])?$")
# Messages that name another line ("already defined on line 12") would churn like line numbers do.
_LINE_REF = re.compile(r"\bline \d+\b")


def normalise(output: str) -> list[tuple[str, str]]:
    """(entry, mypy's own line) for each error in mypy's output; notes and the summary are left out."""
    found = []
    for line in output.splitlines():
        match = _ERROR.match(line.rstrip())
        if match is None:
            continue
        path = match["path"].replace("\\", "/")
        message = _LINE_REF.sub("line N", match["message"])
        found.append((f"{path}: {match['code'] or 'unknown'}: {message}", line.rstrip()))
    return found


def read_baseline(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def domain_entries(entries: list[str], pending: dict[str, str] | None = None) -> list[str]:
    """The entries in a domain module that PENDING does not name: refused in the baseline."""
    pending = PENDING if pending is None else pending
    refused = []
    for entry in entries:
        path = entry.split(": ", 1)[0]
        if path not in pending and any(fnmatchcase(path, pattern) for pattern in DOMAIN):
            refused.append(entry)
    return refused


@dataclass
class Comparison:
    new: list[str] = field(default_factory=list)  # mypy's lines for errors beyond the baseline's count
    fixed: list[str] = field(default_factory=list)  # baseline entries that no longer occur
    refused: list[str] = field(default_factory=list)  # baseline entries in a domain module

    @property
    def ok(self) -> bool:
        return not (self.new or self.fixed or self.refused)


def compare(output: str, baseline: list[str], pending: dict[str, str] | None = None) -> Comparison:
    """mypy's output against the baseline's entries, as multisets. An error in a domain module (one
    `pending` does not name) is new whether baselined or not, and its entry is refused besides."""
    found = normalise(output)
    allowed = Counter(baseline)
    refused = set(domain_entries(list(allowed), pending))
    for entry in refused:
        del allowed[entry]
    current = Counter(entry for entry, _ in found)
    result = Comparison(refused=sorted(e for e in baseline if e in refused))
    over = current - allowed
    for entry, _ in found:
        if over[entry] > 0:
            # Which occurrence is the new one cannot be told without line numbers: all are shown.
            result.new.extend(text for e, text in found if e == entry)
            over[entry] = 0
    result.fixed = sorted((allowed - current).elements())
    return result


def run_mypy() -> str:
    """mypy over the packages [tool.mypy] names, in the form `normalise` reads; exits on a crash."""
    command = [sys.executable, "-m", "mypy", "--no-pretty", "--no-error-summary", "--show-error-codes"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode not in (0, 1):  # 1: type errors; 2: mypy could not run (config, syntax, crash)
        sys.stderr.write(done.stdout + done.stderr)
        sys.exit(f"mypy did not run to the end (exit {done.returncode}).")
    return done.stdout


def write_baseline(entries: list[str]) -> None:
    BASELINE.write_text(HEADER + "".join(f"{entry}\n" for entry in sorted(entries)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="mypy's errors against mypy-baseline.txt, which may only shrink.")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--update", action="store_true", help="remove the entries that were fixed; never adds")
    mode.add_argument("--accept-new", action="store_true", help="rewrite the baseline whole, new errors included")
    args = parser.parse_args(argv)

    baseline = read_baseline(BASELINE.read_text()) if BASELINE.exists() else []
    output = run_mypy()
    result = compare(output, baseline)
    for path, why in PENDING.items():
        print(f"typecheck: {path} is a domain module still allowed baseline entries: {why}.")

    if args.accept_new or args.update:
        current = [entry for entry, _ in normalise(output)]
        if args.update:
            current = list((Counter(current) & Counter(baseline)).elements())
        refused = set(domain_entries(current))
        if refused:
            print("typecheck: refused, these are domain modules, whose errors are fixed and never baselined:")
            print("".join(f"  {text}\n" for entry, text in normalise(output) if entry in refused), end="")
            return 1
        write_baseline(current)
        print(f"typecheck: {BASELINE.name} now has {len(current)} entries (it had {len(baseline)}).")
        if args.update and result.new:
            print(f"typecheck: {len(result.new)} new error(s) were not added; fix them:")
            print("".join(f"  {line}\n" for line in result.new), end="")
            return 1
        return 0

    if result.refused:
        print(f"typecheck: {BASELINE.name} names domain modules, which must have no entry; fix these:")
        print("".join(f"  {entry}\n" for entry in result.refused), end="")
    if result.new:
        print(f"typecheck: {len(result.new)} mypy error(s) not in {BASELINE.name}; fix them:")
        print("".join(f"  {line}\n" for line in result.new), end="")
    if result.fixed:
        print(
            f"typecheck: {len(result.fixed)} of the entries of {BASELINE.name} no longer occur; it only shrinks, so "
            "run `.venv/bin/python scripts/mypy_baseline.py --update` and commit it:"
        )
        print("".join(f"  {entry}\n" for entry in result.fixed), end="")
    if result.ok:
        print(f"typecheck: no error beyond the {len(baseline)} of {BASELINE.name}.")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
