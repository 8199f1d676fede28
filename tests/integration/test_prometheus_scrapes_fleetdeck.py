"""Fleetdeck's own /metrics as a platform team's Prometheus meets it: Debian's Prometheus scrapes a
running Fleetdeck with the bearer token, and evaluates the shipped alert rules on what it scraped."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from django.utils import timezone

from tests.factories import ClusterFactory
from tests.integration import prometheus_server

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "scrape-token-for-the-test"
RULES = Path(__file__).resolve().parents[2] / "deploy" / "monitoring" / "fleetdeck-rules.yml"


def _until(what: str, read, timeout_s: float = 30.0):
    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        last = read()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"{what}: not seen in {timeout_s:.0f} s (last: {last})")


def test_a_real_prometheus_scrapes_fleetdeck_and_evaluates_the_shipped_rules(live_server, settings, team):
    settings.FLEETDECK_METRICS_TOKEN = TOKEN
    now = timezone.now()
    ClusterFactory(team=team, name="up", reachability="ok", last_sync_at=now, last_sync_duration_ms=150)
    ClusterFactory(
        team=team,
        name="down",
        reachability="unreachable",
        last_error="connection refused",
        last_sync_at=now - timedelta(minutes=10),
        last_sync_duration_ms=2000,
    )
    server = prometheus_server.start(live_server.url.removeprefix("http://"), bearer_token=TOKEN, rule_files=(RULES,))
    try:

        def values(promql: str) -> dict[str, float]:
            result = server.api(promql)["data"]["result"]
            return {r["metric"].get("team") or r["metric"].get("adapter", ""): float(r["value"][1]) for r in result}

        assert values(f'fleetdeck_clusters{{reachability="unreachable",team="{team.name}"}}') == {team.name: 1}
        assert values('fleetdeck_outbound_failing_targets{adapter="ray_dashboard"}') == {"ray_dashboard": 1}
        assert values("sum by (team) (fleetdeck_sync_duration_seconds_count)") == {team.name: 2}
        median = values("histogram_quantile(0.5, sum by (le) (fleetdeck_sync_lag_seconds_bucket))")
        assert 0 < median[""] <= 15, median

        # Every shipped rule loads and evaluates against the real series without an error.
        groups = _until(
            "the rules evaluated",
            lambda: [
                g
                for g in httpx.get(f"{server.url}/api/v1/rules", timeout=5, trust_env=False).json()["data"]["groups"]
                if all(r.get("lastEvaluation", "").startswith("2") and r["health"] == "ok" for r in g["rules"])
            ],
        )
        rules = {r["name"]: r for g in groups for r in g["rules"]}
        assert len(rules) == 8 and all(r["health"] == "ok" for r in rules.values()), rules

        # No worker or beat has run in this test: their series are missing, and the stale alerts catch that.
        def heartbeat_alerts():
            listed = httpx.get(f"{server.url}/api/v1/alerts", timeout=5, trust_env=False).json()["data"]["alerts"]
            alerts = {a["labels"]["alertname"]: a for a in listed}
            return alerts if {"FleetdeckWorkerStale", "FleetdeckBeatStale"} <= set(alerts) else None

        pending = _until("both heartbeat alerts pending", heartbeat_alerts)
        assert pending["FleetdeckWorkerStale"]["state"] == "pending"
        assert pending["FleetdeckWorkerStale"]["annotations"]["summary"] == "Fleetdeck's worker has never run a tick"
        assert pending["FleetdeckBeatStale"]["annotations"]["summary"] == "Fleetdeck's beat has never sent a tick"
    finally:
        server.stop()

    # The same Prometheus without the token: its scrape is refused, so it never reports the target up.
    with pytest.raises(TimeoutError, match="target not up"):
        prometheus_server.start(live_server.url.removeprefix("http://"), timeout_s=8).stop()
