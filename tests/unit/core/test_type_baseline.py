"""The type check's gate (scripts/mypy_baseline.py) on mypy output written here: it fails on an error
the baseline lacks, on an entry that no longer occurs and on any entry in a domain module. mypy
itself runs in `make typecheck`, not here: a cold run takes half a minute."""

from __future__ import annotations

import pytest

from tests.scripts import loaded


@pytest.fixture(scope="module")
def gate():
    with loaded("mypy_baseline") as module:
        yield module


ATTR = 'apps/fleet/views.py:40: error: "Model" has no attribute "team"  [attr-defined]'
ATTR_ENTRY = 'apps/fleet/views.py: attr-defined: "Model" has no attribute "team"'
# What `x: int = "a"` in a domain module makes mypy say.
WRONG_TYPE = (
    'apps/remediation/plan_choice.py:12: error: Incompatible types in assignment (expression has type "str", '
    'variable has type "int")  [assignment]'
)


def test_the_baseline_errors_alone_pass(gate):
    output = f"{ATTR}\napps/fleet/views.py:40: note: See https://mypy.readthedocs.io\n"
    assert gate.compare(output, [ATTR_ENTRY]).ok


def test_an_entry_has_no_line_number_so_a_moved_error_still_matches(gate):
    moved = ATTR.replace(":40:", ":97:12:")
    assert gate.normalise(moved) == [(ATTR_ENTRY, moved)]
    assert gate.compare(moved, [ATTR_ENTRY]).ok
    twice = gate.normalise('apps/a.py:3: error: Name "f" already defined on line 1  [no-redef]')
    assert twice[0][0] == 'apps/a.py: no-redef: Name "f" already defined on line N'
    file_level = gate.normalise('apps/a/apps.py: error: Library stubs not installed for "x"  [import-untyped]')
    assert file_level[0][0] == 'apps/a/apps.py: import-untyped: Library stubs not installed for "x"'


def test_a_new_error_fails_with_mypys_line(gate):
    new = 'apps/fleet/views.py:88: error: Argument 1 to "f" has incompatible type "str"; expected "int"  [arg-type]'
    result = gate.compare(f"{ATTR}\n{new}\n", [ATTR_ENTRY])
    assert not result.ok
    assert result.new == [new]
    assert result.fixed == [] and result.refused == []


def test_entries_are_counted_so_a_second_identical_error_is_new(gate):
    second = ATTR.replace(":40:", ":41:")
    result = gate.compare(f"{ATTR}\n{second}\n", [ATTR_ENTRY])
    assert not result.ok
    assert result.new == [ATTR, second]  # which of the two is new cannot be told: both are shown


def test_a_fixed_error_fails_until_the_baseline_shrinks(gate):
    result = gate.compare("", [ATTR_ENTRY])
    assert not result.ok
    assert result.fixed == [ATTR_ENTRY] and result.new == []


def test_a_wrong_type_in_a_domain_module_fails(gate):
    result = gate.compare(WRONG_TYPE, [])
    assert not result.ok
    assert result.new == [WRONG_TYPE]


def test_a_domain_module_in_the_baseline_is_refused_even_while_mypy_reports_it(gate):
    entry = gate.normalise(WRONG_TYPE)[0][0]
    result = gate.compare(WRONG_TYPE, [entry])
    assert not result.ok
    assert result.refused == [entry]
    assert result.new == [WRONG_TYPE]


@pytest.mark.parametrize(
    "path",
    [
        "apps/fleet/services.py",
        "apps/remediation/sizing.py",
        "apps/remediation/measurements.py",
        "apps/remediation/verification.py",
        "apps/changes/protocol.py",
        "apps/changes/planner.py",
        "apps/llm/planner.py",
        "apps/llm/forms.py",
        "integrations/ray/dashboard.py",
        "integrations/egress.py",
    ],
)
def test_the_domain_modules(gate, path):
    assert gate.domain_entries([f"{path}: misc: x"], pending={}) == [f"{path}: misc: x"]


def test_other_modules_may_have_entries(gate):
    entries = ["apps/fleet/views.py: misc: x", "controlplane/metrics.py: misc: x", "apps/remediation/rules.py: misc: x"]
    assert gate.domain_entries(entries, pending={}) == []


def test_the_committed_baseline_names_no_domain_module_and_is_sorted(gate):
    entries = gate.read_baseline(gate.BASELINE.read_text())
    assert gate.domain_entries(entries) == []
    assert entries == sorted(entries)
    # An exemption is for a domain module, and only while the baseline still holds its errors.
    for path in gate.PENDING:
        assert gate.domain_entries([f"{path}: misc: x"], pending={}), path
        assert any(entry.startswith(f"{path}: ") for entry in entries), f"{path} is clean: drop it from PENDING"
