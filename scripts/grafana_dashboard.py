"""Fleetdeck's Grafana dashboard, generated with Grafana's own Foundation SDK into
deploy/monitoring/fleetdeck-dashboard.json (import it in Grafana, or provision it).

    .venv/bin/python scripts/grafana_dashboard.py           # write the JSON
    .venv/bin/python scripts/grafana_dashboard.py --check   # fail when the JSON is not what this makes

Every panel reads the metrics /metrics exports (controlplane/metrics.py); the tests check that it
reads no other, and that Prometheus's promtool parses every query. The sync lag histogram is a
snapshot of every cluster's lag at scrape time, not a counter: its quantiles take no rate()."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders.dashboard import Dashboard, DatasourceVariable, Row
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.builders.stat import Panel as Stat
from grafana_foundation_sdk.builders.timeseries import Panel as TimeSeries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef

OUTPUT = Path(__file__).resolve().parent.parent / "deploy" / "monitoring" / "fleetdeck-dashboard.json"
SOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")

# (row, [(title, kind, unit, [(expr, legend)], description)])
PANELS: list[tuple[str, list[tuple[str, str, str, list[tuple[str, str]], str]]]] = [
    (
        "Fleet",
        [
            (
                "Clusters by reachability",
                "timeseries",
                "short",
                [("sum by (reachability) (fleetdeck_clusters)", "{{reachability}}")],
                "Registered clusters, by what their last sync found.",
            ),
            (
                "Sync lag",
                "timeseries",
                "s",
                [
                    ("histogram_quantile(0.5, sum by (le) (fleetdeck_sync_lag_seconds_bucket))", "p50"),
                    ("histogram_quantile(0.95, sum by (le) (fleetdeck_sync_lag_seconds_bucket))", "p95"),
                ],
                "Seconds since each cluster's last sync, every cluster at scrape time.",
            ),
            (
                "Clusters lagging over 2 minutes",
                "stat",
                "percentunit",
                [
                    (
                        '1 - sum(fleetdeck_sync_lag_seconds_bucket{le="120"}) / sum(fleetdeck_sync_lag_seconds_count)',
                        "lagging",
                    )
                ],
                "Share of clusters whose last sync is more than four default intervals old.",
            ),
        ],
    ),
    (
        "Outbound",
        [
            (
                "Sync duration",
                "timeseries",
                "s",
                [
                    ("histogram_quantile(0.5, sum by (le) (fleetdeck_sync_duration_seconds_bucket))", "p50"),
                    ("histogram_quantile(0.95, sum by (le) (fleetdeck_sync_duration_seconds_bucket))", "p95"),
                ],
                "How long each cluster's last sync took: its dashboard's answers, read and applied.",
            ),
            (
                "Targets failing, by adapter",
                "timeseries",
                "short",
                [("sum by (adapter) (fleetdeck_outbound_failing_targets)", "{{adapter}}")],
                "Clusters, metrics sources and Kubernetes connections whose last request failed.",
            ),
            (
                "Incident deliveries, last day",
                "timeseries",
                "short",
                [('sum by (kind) (fleetdeck_webhook_deliveries_last_day{state="failed"})', "{{kind}} failed")],
                "Deliveries to Alertmanager, Slack and webhooks that failed after their retries.",
            ),
        ],
    ),
    (
        "Incidents",
        [
            (
                "Open incidents by kind",
                "timeseries",
                "short",
                [("sum by (kind) (fleetdeck_open_incidents)", "{{kind}}")],
                "OOM kills, latency spikes, queue build-up, memory pressure.",
            ),
            (
                "Open incidents by team",
                "timeseries",
                "short",
                [("sum by (team, severity) (fleetdeck_open_incidents)", "{{team}} {{severity}}")],
                "Which team's fleet is in trouble, and how badly.",
            ),
        ],
    ),
    (
        "Changes and wizards",
        [
            (
                "Changes in the last day",
                "timeseries",
                "short",
                [("sum by (state) (fleetdeck_changes_last_day)", "{{state}}")],
                "Config changes by their final state: rolled back and drifted ones deserve a look.",
            ),
            (
                "Change duration",
                "timeseries",
                "s",
                [("histogram_quantile(0.95, sum by (le) (fleetdeck_change_duration_seconds_bucket))", "p95")],
                "From the worker taking a change up to its final state, verification included.",
            ),
            (
                "Wizards by state",
                "timeseries",
                "short",
                [("sum by (state) (fleetdeck_wizards_last_day)", "{{state}}")],
                "Remediation wizards, open and finished in the last day.",
            ),
            (
                "Calibration duration",
                "timeseries",
                "s",
                [("histogram_quantile(0.95, sum by (le) (fleetdeck_calibration_duration_seconds_bucket))", "p95")],
                "How long memory calibrations take, start to result.",
            ),
        ],
    ),
    (
        "Control loop",
        [
            (
                "Heartbeat age",
                "timeseries",
                "s",
                [("max by (process) (fleetdeck_heartbeat_age_seconds)", "{{process}}")],
                "Seconds since the worker ran a tick and beat sent one: above three ticks, work is paused.",
            ),
            (
                "Failing tick handlers",
                "stat",
                "short",
                [("sum(fleetdeck_tick_handler_failures)", "failing")],
                "Ticks in a row each failing handler has raised; the others still run.",
            ),
        ],
    ),
]


def dashboard() -> dict:
    board = (
        Dashboard("Fleetdeck")
        .uid("fleetdeck")
        .tags(["fleetdeck", "ray-serve"])
        .refresh("30s")
        .time("now-6h", "now")
        .with_variable(DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
    )
    for row, panels in PANELS:
        board = board.with_row(Row(row))
        for title, kind, unit, queries, description in panels:
            panel = (TimeSeries() if kind == "timeseries" else Stat()).title(title).description(description)
            panel = panel.unit(unit).datasource(SOURCE).height(8).span(24 // len(panels))
            for ref, (expr, legend) in zip("ABCDEFGH", queries, strict=False):
                panel = panel.with_target(Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(SOURCE))
            board = board.with_panel(panel)
    return json.loads(json.dumps(board.build(), cls=JSONEncoder))


def queries(board: dict) -> list[str]:
    return [target["expr"] for panel in board["panels"] for target in panel.get("targets", [])]


def rendered() -> str:
    return json.dumps(dashboard(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when the committed JSON differs")
    args = parser.parse_args(argv)
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != rendered():
            print(f"{OUTPUT} is not what scripts/grafana_dashboard.py makes: run it and commit the result.")
            return 1
        return 0
    OUTPUT.write_text(rendered())
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
