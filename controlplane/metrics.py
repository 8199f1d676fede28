"""Fleetdeck's own metrics, in Prometheus's exposition format, for the platform team's Prometheus.

Every figure is read from the database at scrape time rather than counted in memory: the web processes, the
worker and beat are separate processes (gunicorn and Celery fork), and the database is the one place all of
them write. So no multiprocess directory is needed, a restart loses nothing, and two scrapes of two web
processes agree. What is a count of events (changes, wizard outcomes) is a gauge of rows in a state over a
window, since history is pruned and a counter would fall.

The endpoint is for the team that runs Fleetdeck, not for a team of the fleet: it names every team, so it takes
its own bearer token (FLEETDECK_METRICS_TOKEN), not a user's.
"""

from __future__ import annotations

import hmac
from collections import Counter
from collections.abc import Iterable
from datetime import timedelta

from django.conf import settings
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from apps.calibration.models import MemoryCalibration
from apps.changes.models import Change
from apps.clusters.models import Cluster
from apps.incidents.models import Incident, ScrapeState, WebhookDelivery
from apps.kubernetes.models import KubeConnection, KubeLink
from apps.liveness import services as liveness
from apps.remediation.models import Wizard

# Finished work over this window: long enough for a daily pattern, short enough to stay a cheap query.
WINDOW = timedelta(hours=24)
LAG_BUCKETS = (5, 15, 30, 60, 120, 300, 900, 3600)
DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 900, 1800)
SYNC_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


def _histogram(name: str, documentation: str, values: Iterable[float], buckets: tuple):
    return _team_histogram(name, documentation, {None: list(values)}, buckets)


def _team_histogram(name: str, documentation: str, by_team: dict, buckets: tuple):
    """A histogram with one series per team; the key None means one series without the label."""
    family = HistogramMetricFamily(name, documentation, labels=[] if None in by_team else ["team"])
    for team, values in sorted(by_team.items(), key=lambda item: item[0] or ""):
        counts = [(str(b), sum(1 for v in values if v <= b)) for b in buckets] + [("+Inf", len(values))]
        family.add_metric([] if team is None else [team], counts, sum_value=sum(values))
    return family


class FleetCollector:
    """Reads the fleet's state when Prometheus scrapes."""

    def collect(self):
        now = timezone.now()
        yield from self._clusters(now)
        yield self._incidents()
        yield from self._changes(now)
        yield self._wizards(now)
        yield self._calibrations(now)
        yield from self._liveness(now)
        yield from self._outbound(now)

    def _clusters(self, now):
        clusters = GaugeMetricFamily(
            "fleetdeck_clusters", "Registered clusters by team and reachability.", labels=["team", "reachability"]
        )
        rows = Cluster.objects.values("team__name", "reachability").annotate(n=Count("id"))
        for row in rows:
            clusters.add_metric([row["team__name"], row["reachability"]], row["n"])
        yield clusters
        lags: dict[str, list[float]] = {}
        durations: dict[str, list[float]] = {}
        for team, synced, took_ms in Cluster.objects.values_list("team__name", "last_sync_at", "last_sync_duration_ms"):
            lags.setdefault(team, []).append((now - synced).total_seconds() if synced else LAG_BUCKETS[-1] * 2)
            durations.setdefault(team, []).extend([] if took_ms is None else [took_ms / 1000])
        yield _team_histogram(
            "fleetdeck_sync_lag_seconds",
            f"Seconds since each cluster's last sync, by team (the interval is {settings.FLEETDECK_SYNC_INTERVAL_S} s; "
            "a cluster never synced counts past the last bucket).",
            lags,
            LAG_BUCKETS,
        )
        yield _team_histogram(
            "fleetdeck_sync_duration_seconds",
            "How long each cluster's last sync took, by team (reading its dashboard and applying the answers).",
            durations,
            SYNC_BUCKETS,
        )

    def _incidents(self):
        family = GaugeMetricFamily(
            "fleetdeck_open_incidents",
            "Incidents not resolved, by team, kind and severity.",
            labels=["team", "kind", "severity"],
        )
        rows = (
            Incident.objects.exclude(status=Incident.Status.RESOLVED)
            .values("cluster__team__name", "kind", "severity")
            .annotate(n=Count("id"))
        )
        for row in rows:
            family.add_metric([row["cluster__team__name"], row["kind"], row["severity"]], row["n"])
        return family

    def _changes(self, now):
        since = now - WINDOW
        family = GaugeMetricFamily(
            "fleetdeck_changes_last_day",
            "Changes created in the last 24 hours, by kind and state (rolled_back and failed are the ones to watch).",
            labels=["kind", "state"],
        )
        rows = Change.objects.filter(created_at__gte=since).values("kind", "state").annotate(n=Count("id"))
        for row in rows:
            family.add_metric([row["kind"], row["state"]], row["n"])
        yield family
        durations = [
            (finished - started).total_seconds()
            for started, finished in Change.objects.filter(finished_at__gte=since, started_at__isnull=False)
            .values_list("started_at", "finished_at")
            .iterator()
        ]
        yield _histogram(
            "fleetdeck_change_duration_seconds",
            "Changes finished in the last 24 hours: seconds from start to verified (or failed).",
            durations,
            DURATION_BUCKETS,
        )

    def _wizards(self, now):
        family = GaugeMetricFamily(
            "fleetdeck_wizards_last_day",
            "Wizards by state, open ones and those finished in the last 24 hours.",
            labels=["state"],
        )
        open_states = (Wizard.State.OPEN, Wizard.State.VERIFYING)
        counts = Counter(Wizard.objects.filter(state__in=open_states).values_list("state", flat=True))
        counts.update(Wizard.objects.filter(finished_at__gte=now - WINDOW).values_list("state", flat=True))
        for state in Wizard.State.values:
            family.add_metric([state], counts.get(state, 0))
        return family

    def _calibrations(self, now):
        durations = [
            (finished - started).total_seconds()
            for started, finished in MemoryCalibration.objects.filter(
                finished_at__gte=now - WINDOW, started_at__isnull=False
            )
            .values_list("started_at", "finished_at")
            .iterator()
        ]
        return _histogram(
            "fleetdeck_calibration_duration_seconds",
            "Calibrations finished in the last 24 hours: seconds the job ran.",
            durations,
            DURATION_BUCKETS,
        )

    def _liveness(self, now):
        beats = liveness.current(now)
        age = GaugeMetricFamily(
            "fleetdeck_heartbeat_age_seconds",
            "Seconds since the worker ran a tick and since beat sent one (absent: never).",
            labels=["process"],
        )
        # A process that never ran has no series rather than NaN: every comparison with NaN is false, so a
        # worker that never started would never alert, while absent() catches a missing series.
        for process, at in (("worker", beats.worker_at), ("beat", beats.beat_at)):
            if at:
                age.add_metric([process], (now - at).total_seconds())
        yield age
        failing = GaugeMetricFamily(
            "fleetdeck_tick_handler_failures",
            "Ticks in a row in which a handler raised (0 lines are not listed).",
            labels=["handler"],
        )
        for handler, consecutive, _ in beats.failing_handlers:
            failing.add_metric([handler], consecutive)
        yield failing

    def _outbound(self, now):
        """What each adapter's last request to each target came to, read from the error each one keeps:
        a counter of errors would need every process's memory, and the last outcome is what an alert
        wants (a target that failed once an hour ago and answers now is not a page)."""
        failing = GaugeMetricFamily(
            "fleetdeck_outbound_failing_targets",
            "Targets whose last request through this adapter failed (ray_dashboard: clusters; metrics_scrape and "
            "prometheus: clusters' metrics readings; kubernetes: connections and links).",
            labels=["adapter"],
        )
        scrapes = Counter(
            "prometheus" if prometheus_url else "metrics_scrape"
            for prometheus_url in ScrapeState.objects.exclude(error="").values_list(
                "cluster__prometheus_url", flat=True
            )
        )
        counts = {
            "ray_dashboard": Cluster.objects.exclude(last_error="").count(),
            "metrics_scrape": scrapes["metrics_scrape"],
            "prometheus": scrapes["prometheus"],
            "kubernetes": KubeConnection.objects.exclude(last_error="").count()
            + KubeLink.objects.exclude(last_error="").count(),
        }
        for adapter, n in counts.items():
            failing.add_metric([adapter], n)
        yield failing
        deliveries = GaugeMetricFamily(
            "fleetdeck_webhook_deliveries_last_day",
            "Incident deliveries made in the last 24 hours, by receiver kind and state.",
            labels=["kind", "state"],
        )
        rows = (
            WebhookDelivery.objects.filter(created_at__gte=now - WINDOW)
            .values("webhook__kind", "state")
            .annotate(n=Count("id"))
        )
        for row in rows:
            deliveries.add_metric([row["webhook__kind"], row["state"]], row["n"])
        yield deliveries


def exposition() -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector())
    return generate_latest(registry)


def metrics(request: HttpRequest) -> HttpResponse:
    """GET /metrics with `Authorization: Bearer <FLEETDECK_METRICS_TOKEN>`."""
    token = settings.FLEETDECK_METRICS_TOKEN
    if not token:
        return HttpResponse(
            "Fleetdeck's metrics are off: set FLEETDECK_METRICS_TOKEN and scrape with it as a bearer token.\n",
            status=404,
            content_type="text/plain",
        )
    given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
    if not given or not hmac.compare_digest(given.encode(), token.encode()):
        response = HttpResponse("A bearer token is needed: FLEETDECK_METRICS_TOKEN.\n", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="fleetdeck-metrics"'
        return response
    return HttpResponse(exposition(), content_type=CONTENT_TYPE_LATEST)
