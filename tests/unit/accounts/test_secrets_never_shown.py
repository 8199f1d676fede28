"""Secrets Fleetdeck stores are never shown: every URL of the project, asked by the viewer, operator
and admin of the team that owns the objects, answers without the values of env vars, credentials in
serve.llm's engine arguments or the headers of calibration and warmup requests, while still naming
them. The audit log and the log lines the requests write hold none of them either.

The world is the authorization matrix's team, synced from a cluster whose Serve config carries
secrets, with one object of every kind that holds a config or a request: a config revision and the
one that rotated a token, a change that drifted on that rotation, a new application's change, a
preset and a rollout that set an env var, a calibration sent with an Authorization header and a
warmup profile that sends an API key."""

from __future__ import annotations

import copy
import itertools
import json
import logging

import pytest
from django.db import transaction
from django.test import Client

from apps.accounts.audit import Actor
from apps.accounts.models import AuditEvent, Role
from apps.changes import presets, protocol, rollouts
from apps.changes.models import Change
from apps.fleet import sync
from apps.fleet.models import Application, ConfigRevision
from apps.maintenance import schedules
from apps.remediation import wizards
from apps.remediation.models import Wizard
from tests.conftest import ReplayRay, ray_fixture, route_adapters_to
from tests.unit.accounts.test_authorization_matrix import Case, cases, model_of
from tests.world import LIVE, TeamWorld, build_team, isolate_network, replay_oom_cluster

SLUG = "secretive"
# Every secret holds this, so one search finds any of them.
MARK = "live_secret"
HF_TOKEN = f"hf_{MARK}_123"
ROTATED_TOKEN = f"hf_{MARK}_rotated"
AWS_KEY = f"aws_{MARK}_456"
LLM_KEY = f"vllm_{MARK}_789"
NEW_APP_TOKEN = f"hf_{MARK}_new_app"
PRESET_TOKEN = f"hf_{MARK}_preset"
AUTHORIZATION = f"Bearer {MARK}_header"
WARMUP_KEY = f"{MARK}_warmup"
ROLES = (Role.VIEWER, Role.OPERATOR, Role.ADMIN)


def serve_payload(hf_token: str) -> dict:
    """The OOM cluster's Serve state, its demo application holding secrets where Serve takes them:
    the application's env vars, the Model deployment's own, and serve.llm's engine arguments in args."""
    payload = copy.deepcopy(ray_fixture(LIVE))
    demo = payload["applications"]["demo"]
    config = demo["deployed_app_config"]
    config["runtime_env"]["env_vars"]["HF_TOKEN"] = hf_token
    config["args"] = {"llm_configs": [{"engine_kwargs": {"api_key": LLM_KEY, "max_num_seqs": 8}}]}
    model = next(entry for entry in config["deployments"] if entry["name"] == "Model")
    model["ray_actor_options"]["runtime_env"]["env_vars"]["AWS_SECRET_ACCESS_KEY"] = AWS_KEY
    for deployment in demo["deployments"].values():
        env = deployment["deployment_config"]["ray_actor_options"]["runtime_env"]["env_vars"]
        env["HF_TOKEN"] = hf_token
        if deployment["name"] == "Model":
            env["AWS_SECRET_ACCESS_KEY"] = AWS_KEY
    return payload


class SecretWorld:
    def __init__(self, team: TeamWorld, more: dict[str, list[int]]):
        self.team = team
        # Every object of a kind that holds secrets; the others are the team world's one.
        self.ids = {label: [pk, *more.get(label, [])] for label, pk in team.ids.items()}


def build_secret_world(replay: ReplayRay) -> SecretWorld:
    replay.routes["/api/serve/applications/"] = serve_payload(HF_TOKEN)
    replay.routes["/api/cluster_status"] = "cluster_status.json"
    replay.routes["/nodes"] = "nodes_view_summary.json"
    team = build_team(SLUG)
    operator = Actor(user=team.users["operator"], via="api")
    drifting = Change.objects.select_related("cluster").get(pk=team.id("changes.change"))
    cluster = drifting.cluster
    new_app = protocol.plan_create_app(
        operator,
        cluster,
        app={
            "name": "clone",
            "route_prefix": "/clone",
            "import_path": "demo_app:app",
            "runtime_env": {"env_vars": {"HF_TOKEN": NEW_APP_TOKEN}},
        },
        reason="A copy of demo",
    )
    secret_options = {"ray_actor_options": {"runtime_env": {"env_vars": {"HF_TOKEN": PRESET_TOKEN}}}}
    preset = presets.create_preset(
        operator, team=cluster.team, name="With a token", description="", options=secret_options
    )
    rollout = rollouts.plan_rollout(
        operator, selection={"team": SLUG, "deployment": "Model"}, reason="Token everywhere", options=secret_options
    )
    application = Application.objects.get(pk=team.id("fleet.application"))
    warmup = schedules.save_profile(
        operator, application, {"name": "authorized", "path": "/demo", "headers": {"X-Api-Key": WARMUP_KEY}}
    )
    wizard = Wizard.objects.get(pk=team.id("remediation.wizard"))
    step = wizards.calibrate(
        operator,
        wizard,
        request={
            "kind": "http",
            "method": "POST",
            "path": "/demo",
            "headers": {"Authorization": AUTHORIZATION, "Content-Type": "application/json"},
            "json": {"prompt": "hi"},
        },
        revision=wizard.revision,
    )
    # The token rotates outside Fleetdeck: a second revision, and the planned change drifts.
    replay.routes["/api/serve/applications/"] = serve_payload(ROTATED_TOKEN)
    assert sync.sync_cluster(cluster.pk).ok
    protocol.request_apply(operator, drifting)
    protocol.run(drifting.pk)
    drifting.refresh_from_db()
    assert drifting.state == "drifted" and drifting.drift
    revisions = ConfigRevision.objects.filter(cluster=cluster).order_by("pk").values_list("pk", flat=True)
    return SecretWorld(
        team,
        {
            "fleet.configrevision": [pk for pk in revisions if pk != team.id("fleet.configrevision")],
            "changes.change": [new_app.pk, *Change.objects.filter(rollout=rollout).values_list("pk", flat=True)],
            "changes.preset": [preset.pk],
            "changes.rollout": [rollout.pk],
            "calibration.memorycalibration": [step.calibration_id],
            "maintenance.warmupprofile": [warmup.pk],
        },
    )


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock(), pytest.MonkeyPatch.context() as patch, transaction.atomic():
        replay = ReplayRay()
        replay_oom_cluster(replay)
        route_adapters_to(patch, replay)
        isolate_network(patch)
        yield build_secret_world(replay)
        transaction.set_rollback(True)


@pytest.fixture(autouse=True)
def offline(use_replay, monkeypatch):
    replay_oom_cluster(use_replay)
    use_replay.routes["/api/serve/applications/"] = serve_payload(ROTATED_TOKEN)
    isolate_network(monkeypatch)


def read_cases() -> list[Case]:
    return [case for case in cases() if case.method == "GET" and not case.action]


def urls_of(case: Case, world: SecretWorld) -> list[tuple[str, str]]:
    """(URL, which objects) for every combination of the objects the case's arguments can name."""
    labels = [model_of(case.route, kwarg) for kwarg in case.object_kwargs]
    found = []
    for chosen in itertools.product(*(world.ids[label] for label in labels)):
        picked = dict(zip(labels, chosen, strict=True))
        found.append((case.url(picked.__getitem__), ",".join(f"{label}={pk}" for label, pk in picked.items())))
    return found


def read(url: str, *, api: bool, user, token: str, htmx: bool = False) -> tuple[int, str]:
    client = Client(raise_request_exception=False)
    headers = {"HTTP_HX_REQUEST": "true"} if htmx else {}
    if api:
        headers["HTTP_AUTHORIZATION"] = f"Token {token}"
    else:
        client.force_login(user)
    with transaction.atomic():
        response = client.get(url, **headers)
        transaction.set_rollback(True)
    text = b"".join(response.streaming_content) if response.streaming else response.content
    return response.status_code, text.decode(errors="replace")


# Where a config or request is shown: (URL name, the kind of object, which of them), and what must
# still be read there besides a placeholder: the secrets' names and the settings around them. The
# first change drifted when the token rotated; the second deploys a new application.
SHOWN: list[tuple[str, str, int, tuple[str, ...]]] = [
    ("application-detail", "fleet.application", 0, ("HF_TOKEN", "api_key", "max_ongoing_requests")),
    ("deployment-detail", "fleet.deployment", 0, ("AWS_SECRET_ACCESS_KEY", "max_ongoing_requests")),
    ("configrevision-detail", "fleet.configrevision", -1, ("HF_TOKEN", "AWS_SECRET_ACCESS_KEY")),
    ("configrevision-diff", "fleet.configrevision", -1, ("HF_TOKEN",)),
    ("change-detail", "changes.change", 0, ("HF_TOKEN",)),
    ("change-detail", "changes.change", 1, ("HF_TOKEN",)),
    ("preset-detail", "changes.preset", -1, ("HF_TOKEN",)),
    ("rollout-detail", "changes.rollout", -1, ("HF_TOKEN",)),
    ("memorycalibration-detail", "calibration.memorycalibration", -1, ("Authorization", "application/json")),
    ("warmupprofile-detail", "maintenance.warmupprofile", -1, ("X-Api-Key",)),
    ("fleet:deployment", "fleet.deployment", 0, ("AWS_SECRET_ACCESS_KEY", "max_ongoing_requests")),
    ("fleet:revision", "fleet.configrevision", -1, ("HF_TOKEN",)),
    ("changes:detail", "changes.change", 0, ("HF_TOKEN",)),
    ("changes:detail", "changes.change", 1, ("HF_TOKEN",)),
]


@pytest.mark.django_db
@pytest.mark.parametrize("role", ROLES, ids=lambda role: role.value)
def test_no_page_or_endpoint_shows_a_secret_to_any_member_while_configs_still_name_them(world, role, caplog):
    caplog.set_level(logging.DEBUG)
    user, token = world.team.users[role.value], world.team.tokens[role.value]
    leaks, bodies = [], {}
    for case in read_cases():
        for url, objects in urls_of(case, world):
            for htmx in (False,) if case.route.api else (False, True):
                status, text = read(url, api=case.route.api, user=user, token=token, htmx=htmx)
                bodies.setdefault(url, text)
                if MARK in text:
                    leaks.append(f"{case} {objects}{' (htmx)' if htmx else ''}: {status}")
    assert not leaks, "A secret is shown by:\n  " + "\n  ".join(leaks)
    assert MARK not in caplog.text

    unnamed = []
    for key, label, index, names in SHOWN:
        case = next(c for c in read_cases() if c.key == key and c.route.name == c.route.table_name)
        url = case.url(lambda _: world.ids[label][index])  # noqa: B023 (called before the loop moves on)
        text = bodies[url]
        if not ("<redacted:" in text or "&lt;redacted:" in text) or not all(name in text for name in names):
            unnamed.append(f"{key} {url}: no placeholder, or not all of {names}")
    assert not unnamed, unnamed


@pytest.mark.django_db
def test_the_audit_log_holds_no_secret_of_the_configs_and_requests_it_records(world):
    entries = list(AuditEvent.objects.values_list("action", "changes"))
    assert {"preset.create", "calibration.request", "wizard.calibrate", "warmup_profile.save"} <= {
        a for a, _ in entries
    }
    leaking = [action for action, changes in entries if MARK in json.dumps(changes)]
    assert not leaking, leaking
    calibrated = next(changes for action, changes in entries if action == "calibration.request")
    assert "Authorization" in json.dumps(calibrated)
