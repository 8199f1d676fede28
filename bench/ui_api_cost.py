"""What the UI and the API cost as the fleet grows, and what a production server sustains.

    .venv/bin/python bench/ui_api_cost.py [--quick]

In a scratch database (a new PostgreSQL database on the server DATABASE_URL names, dropped at the
end; else a throwaway SQLite file) the fleet is seeded with bulk_create: per cluster 10
applications, 30 deployments, 100 incidents (with their timeline and OOM kill records), 10
findings, 10 events, 10 config revisions, 3 changes, maintenance, calibrations, wizards and audit
rows. Server time (in-process, Django's test client, DEBUG off, the heap frozen as a web process
freezes it) of the fleet page, a cluster page,
the incident list, the findings page, the wizard list and every list endpoint under /api/v2/ (and
under /api/v1/ the lists whose items v2 made lean, with v1's keyset and counted forms) is
measured at 10 clusters and again at 1,000 (30,000 deployments, 100,000 incidents): p50, p95,
the ratio of the p50s, and the queries each issues.

Then gunicorn (4 sync workers, the pinned version) serves the 1,000-cluster database with
bench/server_settings.py, which adds a trivial DRF endpoint (same authentication, permission
and throttling, no queries of its own); a load generator (2 processes x 4 threads, token auth)
reports requests per second of the main v2 list endpoints and of v1's heavier forms as a ratio to
that trivial endpoint, each measured in 1 s slices alternating with the trivial endpoint so that the ratio
holds on a machine whose speed drifts.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.http_load import LOAD_PROCESSES, LOAD_THREADS, SLICE_SECONDS, TRIVIAL, paired, requests_per_second  # noqa: E402
from bench.scratch_db import analyze, scratch_database  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures" / "ray"
PAGES = {
    "fleet page": "fleet:overview",
    "incident list": "incidents:list",
    "findings page": "remediation:findings",
    "wizard list": "remediation:wizards",
}
# Version 2's lists (lists in time order page by keyset there, numbered pages count only when asked), and
# the counted forms.
LOADED = [
    "clusters",
    "applications",
    "deployments",
    "incidents",
    "findings",
    "changes",
    "rollouts",
    "audit-events",
]
V2_FORMS = [
    "/api/v2/clusters/?count=true",
    "/api/v2/deployments/?count=true",
    "/api/v2/incidents/?page=1&count=true",
    "/api/v2/changes/?page=1&count=true",
]
# Version 1's lists whose items v2 made lean, and v1's other forms: keyset pages, rollouts with their changes counted.
V1_LEAN_IN_V2 = ["deployments", "incidents", "changes", "rollouts"]
FORMS = [
    "/api/v1/incidents/?cursor=",
    "/api/v1/incidents/?view=summary",
    "/api/v1/incidents/?view=summary&cursor=",
    "/api/v1/audit-events/?cursor=",
    "/api/v1/rollouts/?changes=counts",
]
KINDS = ["oom_kill", "latency_spike", "queue_buildup", "memory_pressure", "memory_ratchet"]
RULES = ["gpu-concurrency", "heavy-autoscaling", "unbounded-queue", "single-replica", "cap-below-target"]
DEPLOYMENTS = ("Ingress", "Model", "Postprocess")
TEAMS = 10
GUNICORN_WORKERS = 4
SECONDS_PER_URL = 8.0


def captured() -> tuple[dict, dict, dict]:
    """The demo application's submitted config and Model's effective and submitted configs, as Ray 2.60
    reported them."""
    app = json.loads((FIXTURES / "serve_applications_two_apps.json").read_text())["applications"]["demo"]
    submitted = next(d for d in app["deployed_app_config"]["deployments"] if d["name"] == "Model")
    return app["deployed_app_config"], app["deployments"]["Model"]["deployment_config"], submitted


def seed(first: int, count: int, teams: list, user) -> None:
    """Clusters `first` … `first + count - 1` with everything the lists show, in bulk."""
    from django.utils import timezone

    from apps.accounts.models import AuditEvent
    from apps.calibration.models import MemoryCalibration
    from apps.changes.models import Change, ChangeStep, Rollout
    from apps.clusters.models import Cluster, ClusterEvent
    from apps.fleet.models import Application, ConfigRevision, Deployment
    from apps.incidents.models import Incident, IncidentEvent, OomKillRecord
    from apps.maintenance.models import MaintenanceRun, RecycleSchedule, WarmupProfile
    from apps.remediation.models import Finding, Wizard, WizardStep

    app_config, effective, submitted = captured()
    now, batch = timezone.now(), 2000
    clusters = Cluster.objects.bulk_create(
        [
            Cluster(
                name=f"cluster-{c:04d}",
                team=teams[c % len(teams)],
                dashboard_url=f"http://ray-{c:04d}.example.com:8265",
                labels={"env": "prod" if c % 3 else "staging", "region": f"region-{c % 5}"},
                ray_version="2.60.0",
                session_name=f"session_{c}",
                reachability="ok",
                serve_running=True,
                last_sync_at=now,
                auth_mode="token",
                application_count=10,
                deployment_count=30,
            )
            for c in range(first, first + count)
        ]
    )
    apps = Application.objects.bulk_create(
        [
            Application(
                cluster=cluster,
                name=f"app{a:02d}",
                status="RUNNING",
                route_prefix=f"/app{a:02d}",
                import_path="demo_app:app",
                deployed_app_config={**app_config, "name": f"app{a:02d}"},
                config_hash=f"{cluster.pk:08x}{a:02d}",
            )
            for cluster in clusters
            for a in range(10)
        ],
        batch_size=batch,
    )
    deployments = Deployment.objects.bulk_create(
        [
            Deployment(
                application=app,
                name=name,
                status="HEALTHY",
                status_trigger="CONFIG_UPDATE_COMPLETED",
                effective_config={**effective, "name": name},
                submitted_config={**submitted, "name": name},
                replica_states={"RUNNING": 2},
                running_replicas=2,
                target_replicas=2,
                max_ongoing_requests=8,
                max_queued_requests=100,
                autoscaling_min_replicas=1,
                autoscaling_max_replicas=2,
                autoscaling_target_ongoing_requests=4.0,
                num_cpus=0.2,
            )
            for app in apps
            for name in DEPLOYMENTS
        ],
        batch_size=batch,
    )
    ConfigRevision.objects.bulk_create(
        [
            ConfigRevision(
                application=app,
                cluster_id=app.cluster_id,
                config_hash=app.config_hash,
                ray_session="session",
                config={"app": app.deployed_app_config, "deployments": {"Model": effective}},
            )
            for app in apps
        ],
        batch_size=batch,
    )
    ClusterEvent.objects.bulk_create(
        [
            ClusterEvent(cluster=cluster, kind="recovered", message="The dashboard answers again.")
            for cluster in clusters
            for _ in range(10)
        ],
        batch_size=batch,
    )
    incidents = []
    for k, cluster in enumerate(clusters):
        mine = deployments[k * 30 : (k + 1) * 30]
        for i in range(100):
            dep, kind = mine[i % 30], KINDS[(i // 30) % len(KINDS)]
            started = now - timedelta(hours=(i * 7 + cluster.pk) % (30 * 24), minutes=cluster.pk % 60)
            incidents.append(
                Incident(
                    kind=kind,
                    status="open" if i < 3 else ("acknowledged" if i < 5 else "resolved"),
                    severity="major",
                    cluster=cluster,
                    application_name=f"app{(i % 30) // 3:02d}",
                    deployment_name=dep.name,
                    deployment=dep,
                    title=f"{kind} of app/{dep.name} on {cluster.name}",
                    started_at=started,
                    last_signal_at=started + timedelta(minutes=10),
                    resolved_at=None if i < 5 else started + timedelta(hours=1),
                    signal_count=2,
                    evidence={
                        "summary": "p99 2400 ms for 2 readings in a row (limit 750 ms, baseline 120 ms).",
                        "settings_at_detection": {"max_ongoing_requests": 8, "max_queued_requests": 100},
                    },
                    causes=[
                        {"id": cause, "title": "suspected cause", "reason": "why it is suspected", "rank": r + 1}
                        for r, cause in enumerate(("OOM-2", "OOM-7", "OOM-3"))
                    ],
                )
            )
    incidents = Incident.objects.bulk_create(incidents, batch_size=batch)
    IncidentEvent.objects.bulk_create(
        [
            IncidentEvent(incident=incident, kind="detected", message=incident.evidence["summary"])
            for incident in incidents
        ],
        batch_size=batch,
    )
    OomKillRecord.objects.bulk_create(
        [
            OomKillRecord(
                incident=incident,
                actor_id=f"{incident.pk:032x}",
                replica="sf6rw293",
                node_ip="10.0.0.1",
                used_bytes=30 * 2**30,
                threshold_bytes=29 * 2**30,
                message="Memory usage exceeded threshold",
            )
            for incident in incidents
            if incident.kind == "oom_kill"
        ],
        batch_size=batch,
    )
    Finding.objects.bulk_create(
        [
            Finding(
                cluster_id=dep.application.cluster_id,
                cluster_name=dep.application.cluster.name,
                deployment=dep,
                application_name=dep.application.name,
                deployment_name=dep.name,
                rule=RULES[n % len(RULES)],
                severity="major",
                evidence={"max_ongoing_requests": 8},
                patch={"max_ongoing_requests": 2},
            )
            for n, dep in enumerate(deployments)
            if n % 3 == 0
        ],
        batch_size=batch,
    )
    changes = Change.objects.bulk_create(
        [
            Change(
                cluster=cluster,
                targets=[{"application": "app00", "deployment": "Model"}],
                reason="tune concurrency",
                state="succeeded",
                base_hash="a" * 64,
                base_config={"applications": [app_config]},
                new_config={"applications": [app_config]},
                new_hash="b" * 64,
                json_patch=[
                    {"op": "replace", "path": "/applications/0/deployments/1/max_ongoing_requests", "value": 2}
                ],
                created_by=user,
                applied_by=user,
                started_at=now - timedelta(days=j),
                finished_at=now - timedelta(days=j),
            )
            for cluster in clusters
            for j in range(3)
        ],
        batch_size=batch,
    )
    ChangeStep.objects.bulk_create(
        [
            ChangeStep(change=change, state=state, message=state)
            for change in changes
            for state in ("checking", "pushing", "succeeded")
        ],
        batch_size=batch,
    )
    for g in range(0, len(changes), 150):
        rollout = Rollout.objects.create(reason="fleet-wide concurrency cap", state="succeeded", created_by=user)
        Change.objects.filter(pk__in=[change.pk for change in changes[g : g + 150 : 3]]).update(rollout=rollout, wave=0)
    profiles = WarmupProfile.objects.bulk_create(
        [WarmupProfile(application=apps[k * 10], name="warm", path="/warm") for k in range(len(clusters))],
        batch_size=batch,
    )
    RecycleSchedule.objects.bulk_create(
        [
            RecycleSchedule(
                deployment=deployments[k * 30 + 1],
                every_hours=6,
                warmup=profiles[k],
                next_run_at=now + timedelta(hours=6),
            )
            for k in range(len(clusters))
        ],
        batch_size=batch,
    )
    MaintenanceRun.objects.bulk_create(
        [
            MaintenanceRun(
                kind=kind,
                trigger="schedule",
                state="succeeded",
                cluster=cluster,
                deployment=deployments[k * 30 + 1],
                started_at=now,
                finished_at=now,
            )
            for k, cluster in enumerate(clusters)
            for kind in ("recycle", "warmup")
        ],
        batch_size=batch,
    )
    MemoryCalibration.objects.bulk_create(
        [
            MemoryCalibration(
                cluster=cluster,
                deployment=deployments[k * 30 + 1],
                application_name="app00",
                deployment_name="Model",
                submission_id=f"calibration-{cluster.pk}",
                state="succeeded",
                points=[{"x": 1, "peak_bytes": 2**30}],
            )
            for k, cluster in enumerate(clusters)
        ],
        batch_size=batch,
    )
    wizards = Wizard.objects.bulk_create(
        [
            Wizard(
                cluster=cluster,
                deployment=deployments[k * 30 + 1],
                application_name="app00",
                deployment_name="Model",
                incident=incidents[k * 100],
                state="resolved" if k % 20 else "open",
                created_by=user,
            )
            for k, cluster in enumerate(clusters)
            if k % 10 == 0
        ],
        batch_size=batch,
    )
    WizardStep.objects.bulk_create(
        [
            WizardStep(wizard=wizard, position=p, kind="config", title="Cap concurrency")
            for wizard in wizards
            for p in (1, 2)
        ],
        batch_size=batch,
    )
    AuditEvent.objects.bulk_create(
        [
            AuditEvent(
                actor=user,
                actor_name=user.username,
                action="cluster.sync",
                team=cluster.team,
                object_type="cluster",
                object_id=str(cluster.pk),
                object_repr=cluster.name,
            )
            for cluster in clusters
            for _ in range(5)
        ],
        batch_size=batch,
    )


def setup_people():
    from django.contrib.auth import get_user_model

    from apps.accounts.audit import Actor
    from apps.accounts.models import Membership, Team
    from apps.accounts.services import rotate_token
    from apps.changes.models import Preset
    from apps.incidents.models import Webhook

    user = get_user_model().objects.create_user(username="operator-on-call", password="unused-password-1")
    teams = [Team.objects.create(name=f"Team {t}", slug=f"team-{t}") for t in range(TEAMS)]
    Membership.objects.bulk_create([Membership(user=user, team=team, role="admin") for team in teams])
    for team in teams:
        Preset.objects.create(
            slug=f"{team.slug}-gpu", name=f"{team.name} GPU", options={"max_ongoing_requests": 2}, team=team
        )
        Webhook.objects.create(team=team, url=f"https://hooks.example.com/{team.slug}")
    return user, teams, rotate_token(Actor.system(via="cli"), user)


def urls(cluster_pk: int) -> dict[str, str]:
    from django.urls import reverse

    from controlplane.urls import router

    found = {label: reverse(name) for label, name in PAGES.items()}
    found["cluster page"] = reverse("fleet:cluster", args=[cluster_pk])
    for _, _, basename in sorted(router.registry, key=lambda entry: entry[0]):
        found[f"GET {reverse(f'v2:{basename}-list')}"] = reverse(f"v2:{basename}-list")
    found.update({f"GET {url}": url for url in V2_FORMS})
    found.update({f"GET /api/v1/{name}/": f"/api/v1/{name}/" for name in V1_LEAN_IN_V2})
    found.update({f"GET {url}": url for url in FORMS})
    return found


def server_times(user, token: str, targets: dict[str, str], repeats: int) -> dict[str, tuple[float, float, int]]:
    """p50 and p95 (ms) and the query count of each URL, in-process; a slow URL gets at least 5
    requests, then as many as fit in SECONDS_PER_URL."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    page_client = Client(HTTP_HOST="127.0.0.1")
    page_client.force_login(user)
    api_client = Client(HTTP_HOST="127.0.0.1", HTTP_AUTHORIZATION=f"Token {token}")
    results = {}
    for label, url in targets.items():
        client = api_client if url.startswith("/api/") else page_client
        for _ in range(2):
            assert client.get(url).status_code == 200, url
        with CaptureQueriesContext(connection) as queries:
            client.get(url)
        count = len(queries)  # read now: the capture is a view of a log the next request empties
        times: list[float] = []
        budget = time.monotonic() + SECONDS_PER_URL
        while len(times) < repeats and (len(times) < 5 or time.monotonic() < budget):
            started = time.perf_counter()
            client.get(url)
            times.append((time.perf_counter() - started) * 1000)
        cuts = statistics.quantiles(times, n=20)
        results[label] = (statistics.median(times), cuts[18], count)
    return results


# --- production server and load ----------------------------------------------------------------


def load(env: dict, token: str, seconds: float) -> dict[str, tuple[float, int, float]]:
    from apps.demo.local_ray import free_port

    port = free_port()
    server = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "gunicorn"),
            "controlplane.wsgi:application",
            "--workers",
            str(GUNICORN_WORKERS),
            "--bind",
            f"127.0.0.1:{port}",
            "--log-level",
            "warning",
        ],
        cwd=REPO,
        env={**env, "DJANGO_SETTINGS_MODULE": "bench.server_settings", "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                connection.request("GET", "/healthz", headers={"Host": "127.0.0.1"})
                if connection.getresponse().status == 200:
                    break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"gunicorn did not start:\n{server.stderr.read().decode()[-3000:]}")
            time.sleep(0.3)
        paths = {
            **{f"v2 {name}": f"/api/v2/{name}/" for name in LOADED},
            **{f"v2 {url.removeprefix('/api/v2/')}": url for url in V2_FORMS},
            **{f"v1 {name}": f"/api/v1/{name}/" for name in V1_LEAN_IN_V2},
            **{f"v1 {url.removeprefix('/api/v1/')}": url for url in FORMS},
        }
        for path in [TRIVIAL, *paths.values()]:  # every worker imports and warms its code paths first
            requests_per_second(port, path, token, 0.5)
        return {label: paired(port, path, token, seconds) for label, path in paths.items()}
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and shorter load phases")
    args = parser.parse_args()
    repeats, seconds = (10, 4.0) if args.quick else (30, 10.0)
    print(
        f"machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, load average at start "
        f"{os.getloadavg()[0]:.2f} (other processes share these cores: figures are upper bounds)"
    )
    with scratch_database("ui") as (url, engine):
        var = tempfile.mkdtemp(prefix="fleetdeck-bench-var-")
        env = {
            **os.environ,
            "DATABASE_URL": url,
            "DJANGO_SETTINGS_MODULE": "controlplane.settings",
            "FLEETDECK_DEBUG": "0",
            "FLEETDECK_ALLOW_DEV_SECRET": "1",
            # The simulated clusters listen on loopback: Fleetdeck calls only what its allow-list covers.
            "FLEETDECK_CLUSTER_NETWORKS": "127.0.0.0/8,::1/128",
            "FLEETDECK_LOG_LEVEL": "ERROR",
            "FLEETDECK_SECURE_COOKIES": "0",
            "FLEETDECK_VAR_DIR": var,
            "FLEETDECK_STATIC_ROOT": f"{var}/static",
            # The load generator is one user: the per-user throttle would measure itself.
            "FLEETDECK_API_THROTTLE_USER": "100000000/min",
        }
        os.environ.update(env)
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection
        from django.urls import get_resolver

        from controlplane import heap

        call_command("migrate", verbosity=0)
        call_command("collectstatic", interactive=False, verbosity=0)  # pages link the hashed names, as in production
        user, teams, token = setup_people()
        started = time.monotonic()
        seed(0, 10, teams, user)
        seeded = time.monotonic() - started
        from apps.clusters.models import Cluster

        targets = urls(Cluster.objects.order_by("pk").first().pk)
        analyze()
        # As a web process does once loaded (controlplane/wsgi.py): the collector skips what the
        # process holds for good, so the figures carry a server's collections, not the seeding's.
        get_resolver().url_patterns  # noqa: B018 (the access loads every view)
        heap.freeze()
        small = server_times(user, token, targets, repeats)
        started = time.monotonic()
        for first in range(10, 1000, 110):
            seed(first, 110, teams, user)
        seeded += time.monotonic() - started
        analyze()
        heap.freeze()
        large = server_times(user, token, targets, repeats)
        from apps.fleet.models import Deployment
        from apps.incidents.models import Incident

        print(
            f"database: {engine}; seeded {Cluster.objects.count()} clusters, {Deployment.objects.count()} deployments, "
            f"{Incident.objects.count()} incidents in {seeded:.0f} s; the user is an admin of {TEAMS} teams "
            "(not a superuser)"
        )
        print(
            f"\nserver time, ms ({repeats} requests each, at least 5 for pages slower than "
            f"{SECONDS_PER_URL / repeats * 1000:.0f} ms; in-process):"
        )
        print(f"  {'':40s} {'10 clusters':>21s} {'1,000 clusters':>21s} {'p50':>7s}")
        print(
            f"  {'':40s} {'p50':>6s} {'p95':>6s} {'queries':>7s} {'p50':>6s} {'p95':>6s} {'queries':>7s} {'ratio':>7s}"
        )
        for label in targets:
            (a50, a95, aq), (b50, b95, bq) = small[label], large[label]
            print(f"  {label:40s} {a50:6.1f} {a95:6.1f} {aq:7d} {b50:6.1f} {b95:6.1f} {bq:7d} {b50 / a50:7.2f}")
        connection.close()
        rates = load(env, token, seconds)
        shutil.rmtree(var, ignore_errors=True)
    print(
        f"\nrequests per second against gunicorn {GUNICORN_WORKERS} sync workers, 1,000 clusters, "
        f"{LOAD_PROCESSES}x{LOAD_THREADS} concurrent clients, {seconds:g} s each in {SLICE_SECONDS:g} s slices "
        "alternating with the trivial DRF endpoint (the baseline: same authentication, permission and throttling, "
        "no queries):"
    )
    print(f"  {'':40s} {'req/s':>8s} {'trivial':>8s} {'ratio':>6s}")
    for label, (rate, failed, base) in rates.items():
        print(f"  {label:40s} {rate:8.1f} {base:8.1f} {rate / base:6.2f}" + (f"  ({failed} failed)" if failed else ""))


if __name__ == "__main__":
    main()
