"""The alert rules shipped in deploy/monitoring, checked and unit-tested by Prometheus's own promtool, and
written against metric names /metrics really exports."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.scripts import loaded

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "monitoring"
# `make test` installs it (scripts/install-monitoring.sh), as it installs the browser tests' Chromium.
PROMTOOL = os.environ.get("FLEETDECK_PROMTOOL", "/usr/bin/promtool")


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], cwd=RULES, capture_output=True, text=True, timeout=120)


def test_the_rules_are_valid_prometheus_rules():
    checked = promtool("check", "rules", "fleetdeck-rules.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 8 rules found" in checked.stdout


def test_each_alert_fires_when_and_only_when_its_test_says():
    tested = promtool("test", "rules", "fleetdeck-rules.test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr


@pytest.mark.django_db
def test_the_rules_read_only_metrics_fleetdeck_exports(client, settings):
    settings.FLEETDECK_METRICS_TOKEN = "t"
    exported = client.get("/metrics", HTTP_AUTHORIZATION="Bearer t").content.decode()
    names = set()
    for family in text_string_to_metric_families(exported):
        names |= {sample.name for sample in family.samples} | {family.name}
    used = set(re.findall(r"\b(fleetdeck_[a-z_]+)", (RULES / "fleetdeck-rules.yml").read_text()))
    assert used and used <= names | {n + "_bucket" for n in names} | {n + "_count" for n in names}, used - names


def test_promtool_parses_every_query_of_the_grafana_dashboard(tmp_path):
    with loaded("grafana_dashboard") as dashboard:
        queries = dashboard.queries(dashboard.dashboard())
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [{"record": f"fleetdeck:dashboard:{n}", "expr": q} for n, q in enumerate(queries)],
            }
        ]
    }
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump(rules))
    checked = promtool("check", "rules", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(queries)} rules found" in checked.stdout
