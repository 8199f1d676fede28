"""A team with one object of every kind a URL can point at, built through the services from
payloads replayed from a real Ray 2.60 cluster (an OOM-killed deployment), so the objects are the
ones production holds. The authorization matrix builds two such teams; the API fuzz test one."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import ClassVar

from django.apps import apps
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.authtoken.models import Token

from apps.accounts.audit import Actor, record
from apps.accounts.models import Membership, Role, Team
from apps.calibration.models import MemoryCalibration
from apps.changes import presets, protocol, rollouts
from apps.changes.models import Preset
from apps.clusters.models import Cluster
from apps.fleet import sync
from apps.fleet.models import Application, ConfigRevision, Deployment
from apps.incidents import services as incidents
from apps.incidents.models import Incident, Webhook
from apps.kubernetes import services as kube
from apps.kubernetes.models import KubeLink
from apps.maintenance import dispatch, schedules
from apps.remediation import findings, wizards
from apps.remediation.models import Finding
from apps.scaler import services as scalers
from apps.scaler.models import ScalerDecision

LIVE = "serve_applications_oom_t2_demo_via_ingress_after_recovery.json"
DEAD = "state_actors_dead_oom_t2_demo_via_ingress_detail.json"
ROLES = (Role.VIEWER, Role.OPERATOR, Role.ADMIN)


def replay_oom_cluster(replay) -> None:
    """Point the replayed dashboard at a cluster whose `demo/Model` was just OOM-killed, and
    which accepts jobs (calibrations)."""
    replay.routes["/api/serve/applications/"] = LIVE
    replay.routes["/api/v0/actors"] = DEAD
    replay.routes["/api/jobs/"] = "jobs_submit_response.json"


def isolate_network(monkeypatch) -> None:
    """Refuse to resolve any name but loopback's: a request that escaped the fakes fails (as an
    unreachable host) instead of leaving the machine. Warmups and remedy checks call Serve's
    HTTP route, which no fake stands in for."""
    resolve = socket.getaddrinfo

    def loopback_only(host, *args, **kwargs):
        if host not in ("localhost", "127.0.0.1", "::1"):
            raise socket.gaierror(socket.EAI_NONAME, f"{host}: the tests reach no network")
        return resolve(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", loopback_only)


@dataclass
class TeamWorld:
    """One team's members with their API tokens, and the primary keys of its objects: keys, not
    model instances, which would go stale as requests change the rows."""

    KINDS: ClassVar[tuple[str, ...]] = (
        "clusters.cluster",
        "fleet.application",
        "fleet.deployment",
        "fleet.configrevision",
        "changes.change",
        "changes.rollout",
        "changes.preset",
        "maintenance.recycleschedule",
        "maintenance.warmupprofile",
        "maintenance.maintenancerun",
        "incidents.incident",
        "incidents.webhook",
        "remediation.finding",
        "remediation.wizard",
        "calibration.memorycalibration",
        "accounts.auditevent",
        "kubernetes_link.kubeconnection",
        "kubernetes_link.kubelink",
        "scaler.scaler",
        "scaler.scalerdecision",
    )

    slug: str
    team: int = 0
    users: dict[str, object] = field(default_factory=dict)
    tokens: dict[str, str] = field(default_factory=dict)
    ids: dict[str, int] = field(default_factory=dict)

    def id(self, model_label: str) -> int:
        return self.ids[model_label]


def build_team(slug: str) -> TeamWorld:
    """Needs the replayed dashboard (`use_replay` + `replay_oom_cluster`). Nothing is enqueued:
    tasks are sent on commit, and callers run inside a transaction that never commits."""
    world = TeamWorld(slug=slug)
    team = Team.objects.create(name=f"{slug.title()} Team", slug=slug)
    world.team = team.pk
    User = get_user_model()
    for role in ROLES:
        user = User.objects.create_user(username=f"{slug}-{role.value}", password="pw")
        Membership.objects.create(user=user, team=team, role=role)
        world.users[role.value] = user
        world.tokens[role.value] = Token.objects.create(user=user).key
    operator = Actor(user=world.users["operator"], via="api")

    cluster = Cluster.objects.create(
        name=f"{slug}-gpu", team=team, dashboard_url=f"http://{slug}.ray.test:8265", ray_version="2.60.0"
    )
    assert sync.sync_cluster(cluster.pk).ok
    incidents.detect(cluster.pk)
    findings.recompute(cluster.pk)
    application = Application.objects.get(cluster=cluster, name="demo")
    deployment = Deployment.objects.get(application=application, name="Model")
    incident = Incident.objects.filter(cluster=cluster, deployment_name="Model").first()
    wizard, _ = wizards.start(operator, incident=incident)
    change = protocol.plan_change(
        operator,
        cluster,
        targets=[{"application": "demo", "deployment": "Model"}],
        reason="Fewer requests per replica",
        options={"max_ongoing_requests": 5},
    )
    preset = presets.create_preset(
        operator, team=team, name=f"{slug} preset", description="", options={"max_ongoing_requests": 6}
    )
    rollout = rollouts.plan_rollout(
        operator,
        selection={"team": slug, "deployment": "Model"},
        reason="Fleet-wide cap",
        options={"max_ongoing_requests": 7},
    )
    profile = schedules.save_profile(
        operator, application, {"name": "warm", "path": "/demo", "requests": 2, "concurrency": 1}
    )
    schedule = schedules.save_schedule(operator, deployment, {"every_hours": 6, "warmup": profile})
    run = dispatch.request_recycle(operator, deployment)
    webhook = Webhook.objects.create(team=team, url=f"https://hooks.{slug}.test/incidents")
    connection = kube.create_connection(
        Actor(user=world.users["admin"], via="api"),
        team=team,
        name=f"{slug}-k8s",
        namespaces=["serve"],
        kubeconfig=kubeconfig(slug),
    )
    link = KubeLink.objects.create(
        cluster=cluster,
        connection=connection,
        kind=KubeLink.Kind.RAYCLUSTER,
        namespace="serve",
        name=f"{slug}-raycluster",
    )
    now = timezone.now()
    calibration = MemoryCalibration.objects.create(
        deployment=deployment,
        cluster=cluster,
        application_name="demo",
        deployment_name="Model",
        submission_id=f"fleetdeck-calibration-{slug}",
        state=MemoryCalibration.State.SUCCEEDED,
        axis="concurrency",
        device="cpu",
        baseline_bytes=100 << 20,
        points=[{"x": 1, "peak_bytes": 200 << 20}, {"x": 2, "peak_bytes": 300 << 20}],
        monotone=True,
        levels=[1, 2],
        created_by=world.users["operator"],
        started_at=now,
        finished_at=now,
    )
    # On the other deployment: `fleet.deployment` stays free for the API's create to succeed.
    scaler = scalers.create_shadow_scaler(
        operator, Deployment.objects.get(application=application, name="Echo"), min_replicas=1, max_replicas=3
    )
    decision = ScalerDecision.objects.create(
        scaler=scaler, at=now, target=2, current=1, kind="up", reason="Burst: needs 2", inputs={}
    )
    world.ids = {
        "clusters.cluster": cluster.pk,
        "fleet.application": application.pk,
        "fleet.deployment": deployment.pk,
        "fleet.configrevision": ConfigRevision.objects.filter(application=application).latest("observed_at").pk,
        "changes.change": change.pk,
        "changes.rollout": rollout.pk,
        "changes.preset": preset.pk,
        "maintenance.recycleschedule": schedule.pk,
        "maintenance.warmupprofile": profile.pk,
        "maintenance.maintenancerun": run.pk,
        "incidents.incident": incident.pk,
        "incidents.webhook": webhook.pk,
        "remediation.finding": Finding.objects.filter(cluster=cluster).order_by("pk").first().pk,
        "remediation.wizard": wizard.pk,
        "calibration.memorycalibration": calibration.pk,
        "kubernetes_link.kubeconnection": connection.pk,
        "kubernetes_link.kubelink": link.pk,
        "scaler.scaler": scaler.pk,
        "scaler.scalerdecision": decision.pk,
        # One no member caused, so only the team's admins see it.
        "accounts.auditevent": record(Actor.system(), "cluster.sync", cluster, team=team).pk,
    }
    assert set(world.ids) == set(TeamWorld.KINDS)
    return world


def kubeconfig(slug: str) -> str:
    """A token kubeconfig for an API server that does not resolve (tests refuse the network)."""
    return (
        "apiVersion: v1\nkind: Config\ncurrent-context: main\n"
        f"clusters:\n- name: main\n  cluster:\n    server: https://kube.{slug}.test:6443\n"
        "users:\n- name: main\n  user:\n    token: not-a-real-token\n"
        "contexts:\n- name: main\n  context:\n    cluster: main\n    user: main\n"
    )


def builtin_preset_id() -> int:
    return Preset.objects.filter(builtin=True).order_by("pk").values_list("pk", flat=True).first()


def builtin_preset_slug() -> str:
    return Preset.objects.get(pk=builtin_preset_id()).slug


def api_model(url_name: str) -> str:
    """The model label behind an API route: the router's basename is the model's name."""
    basename = url_name.rsplit("-", 1)[0]
    for model in apps.get_models():
        if model._meta.model_name == basename:
            return model._meta.label_lower
    raise LookupError(f"{url_name}: no model is called {basename!r}")
