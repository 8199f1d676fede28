"""The Grafana dashboard shipped in deploy/monitoring: what scripts/grafana_dashboard.py makes, every
panel on the Prometheus picked in its variable, and every query on a metric /metrics exports."""

from __future__ import annotations

import json
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.factories import ClusterFactory
from tests.scripts import loaded


@pytest.fixture(scope="module")
def grafana_dashboard():
    with loaded("grafana_dashboard") as module:
        yield module


def test_the_committed_json_is_what_the_generator_makes(grafana_dashboard):
    assert grafana_dashboard.main(["--check"]) == 0, "run scripts/grafana_dashboard.py and commit the JSON"


def test_every_panel_reads_the_chosen_prometheus(grafana_dashboard):
    board = json.loads(grafana_dashboard.OUTPUT.read_text())
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert panels and all(p["datasource"] == {"type": "prometheus", "uid": "${datasource}"} for p in panels)
    assert [v["name"] for v in board["templating"]["list"]] == ["datasource"]


@pytest.mark.django_db
def test_every_query_reads_a_metric_fleetdeck_exports(grafana_dashboard, client, settings, team):
    ClusterFactory(team=team)  # a fleet, so the per-team series exist
    settings.FLEETDECK_METRICS_TOKEN = "t"
    exported = client.get("/metrics", HTTP_AUTHORIZATION="Bearer t").content.decode()
    names = set()
    for family in text_string_to_metric_families(exported):
        names |= {family.name} | {sample.name for sample in family.samples}
    used = set()
    for query in grafana_dashboard.queries(grafana_dashboard.dashboard()):
        used |= set(re.findall(r"\b(fleetdeck_[a-z_]+)", query))
    assert used and used <= names, used - names
