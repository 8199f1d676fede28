"""What clients saw at a cluster's Serve proxy while Fleetdeck acted on it (a push, a recycle, a
rollout wave): requests answered and failed, by HTTP code, per application, from two readings of
the proxy's counters taken before and after (through the cluster's Prometheus, else its metrics
endpoint: `metric_sources`). Serve can report every application RUNNING while
its proxy answered 500s to requests cut by a replica that went away: only these counters say.

The proxy's counters reach the metrics endpoint once per export interval (Ray's
`metrics_report_interval_ms`, 10 s by default), so the closing scrape waits that long after the
action ends, or the errors of its last seconds would be missed."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from django.conf import settings

from apps.fleet import metric_sources
from apps.fleet.metric_readings import HTTP_ERRORS, HTTP_REQUESTS, is_failure, read
from integrations import ray_metrics
from integrations.ray_metrics import Sample, Scrape

COUNTERS = (HTTP_REQUESTS, HTTP_ERRORS)


def opening(cluster) -> dict:
    """The proxy's counters now, as JSON to keep on the change or run until it ends; what went
    wrong instead when the cluster has no metrics source or it does not answer."""
    scrape, why = _scrape(cluster)
    if scrape is None:
        return {"why": why}
    return {
        "at": scrape.at,
        "samples": [[s.name, s.labels, s.value] for s in scrape.samples],
        "source": metric_sources.source(cluster),
    }


def closing(cluster, opened: dict | None, *, settle_s: float | None = None) -> dict:
    """What clients saw between `opened` and now, after waiting one export interval."""
    if not opened or "samples" not in opened:
        return _unmeasured((opened or {}).get("why") or "No opening reading of the proxy's counters was taken.")
    if opened.get("source", "metrics") != metric_sources.source(cluster):
        return _unmeasured("the cluster's metrics source changed meanwhile; its counters cannot be compared.")
    time.sleep(settings.FLEETDECK_CLIENT_IMPACT_SETTLE_S if settle_s is None else settle_s)
    current, why = _scrape(cluster)
    if current is None:
        return _unmeasured(why)
    before = Scrape(at=opened["at"], samples=[Sample(name, labels, value) for name, labels, value in opened["samples"]])
    return summary(before, current)


def summary(before: Scrape, after: Scrape) -> dict:
    reading = read(before, after)
    by_application = {}
    for name, app in sorted(reading.applications.items()):
        failed = {code: round(n) for code, n in sorted(app.errors_by_code.items()) if is_failure(code) and round(n)}
        by_application[name] = {"requests": round(app.requests), "failed": sum(failed.values()), "by_code": failed}
    requests = sum(a["requests"] for a in by_application.values())
    failed = sum(a["failed"] for a in by_application.values())
    return {
        "measured": True,
        "since": _iso(before.at),
        "until": _iso(after.at),
        "requests": requests,
        "failed": failed,
        "share": round(failed / requests, 6) if requests else None,
        "by_application": by_application,
        "warnings": reading.warnings,
    }


def public(impact: dict | None) -> dict:
    """What the API and pages show: the summary, not the counters a running change keeps."""
    if impact and "opening" in impact:
        return {"measuring": True}
    return impact or {}


def combined(impacts: list[dict]) -> dict:
    """Several measured windows (a rollout wave's changes) as one."""
    measured = [i for i in impacts if i and i.get("measured")]
    requests = sum(i["requests"] for i in measured)
    failed = sum(i["failed"] for i in measured)
    return {
        "measured": bool(measured),
        "windows": len(measured),
        "unmeasured": len(impacts) - len(measured),
        "requests": requests,
        "failed": failed,
        "share": round(failed / requests, 6) if requests else None,
    }


def sentence(impact: dict | None) -> str:
    """One line for a change's steps, a run's log and the pages."""
    if not impact:
        return ""
    if impact.get("measuring"):
        return "Measuring: the proxy's counters are read again when the change ends."
    if not impact.get("measured"):
        return f"Clients not measured: {impact.get('why', 'no reading')}"
    if not impact["requests"]:
        return "Clients: no request reached the proxy meanwhile."
    codes = {}
    for app in impact.get("by_application", {}).values():
        for code, n in app["by_code"].items():
            codes[code] = codes.get(code, 0) + n
    detail = ", ".join(f"{code} ×{n}" for code, n in sorted(codes.items()))
    return (
        f"Clients: {impact['requests']} requests at the proxy meanwhile, {impact['failed']} failed "
        f"({100 * impact['share']:.2f} %{'; ' + detail if detail else ''})."
    )


def _scrape(cluster) -> tuple[Scrape | None, str]:
    if not cluster.has_metrics_source:
        return None, (
            "the cluster has no metrics source (set its Prometheus or metrics URL to measure the proxy's errors)."
        )
    try:
        scrape = metric_sources.current(cluster, COUNTERS)
    except ray_metrics.MetricsUnavailable as exc:
        return None, exc.message
    return Scrape(at=scrape.at, samples=[s for s in scrape.samples if s.name in COUNTERS]), ""


def _unmeasured(why: str) -> dict:
    return {"measured": False, "why": why}


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, tz=UTC).isoformat()
