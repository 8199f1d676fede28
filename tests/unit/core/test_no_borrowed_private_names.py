"""No module imports another module's private (underscored) names: what one module offers another is public,
named and documented there. A deliberate violation fails this test (see the last case)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PACKAGES = ("apps", "controlplane", "integrations", "workers")


def borrowed(source: str, filename: str = "<module>") -> list[str]:
    """`from x import _name` lines of a module's source, where x is one of this project's packages."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
            found += [
                f"{filename}:{node.lineno} from {node.module} import {alias.name}"
                for alias in node.names
                if alias.name.startswith("_") and not alias.name.startswith("__")
            ]
    return found


def test_no_module_borrows_a_private_name():
    offences = []
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            offences += borrowed(path.read_text(), str(path.relative_to(REPO)))
    assert offences == []


def test_a_borrowed_private_name_is_caught():
    assert borrowed("from apps.remediation.wizards import _locked\n") == [
        "<module>:1 from apps.remediation.wizards import _locked"
    ]
    assert borrowed("from django.db import _private\nfrom apps.core import ticks\n") == []
