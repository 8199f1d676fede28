"""A scaler in control, against a replayed dashboard that takes a PUT and a scale request the way
Ray 2.60 does: turned on and off through the push protocol, its count kept across every push,
sent through the scale API by the tick, and handed back to Serve's autoscaler by the watchdog."""

from __future__ import annotations

import copy
import json
import time
from datetime import timedelta

import httpx
import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from apps.changes import planner, protocol
from apps.changes.models import Change, ChangeState
from apps.clusters.models import Cluster
from apps.fleet.models import Deployment
from apps.scaler import control, shadow
from apps.scaler import policy as policies
from apps.scaler.models import Scaler, ScalerDecision
from apps.scaler.services import create_shadow_scaler
from integrations.ray.parsing import parse_serve_status
from tests.conftest import ray_fixture
from tests.unit.scaler.conftest import MIB, record_readings

pytestmark = pytest.mark.django_db

SCALE = "/api/v1/applications/{app}/deployments/{dep}/scale"


class RayWithScaleApi:
    """The Serve state behind the dashboard: a PUT stamps every application sent, records its
    config and flag, and sets each deployment's effective options from its entry (autoscaling or a
    fixed count, as Serve does); the scale API sets the target of an externally scaled application's
    deployment and answers 412, with Ray's message, for any other."""

    def __init__(self):
        self.payload = ray_fixture("serve_applications_two_apps.json")
        self.pushes: list[dict] = []
        self.scales: list[tuple[str, int]] = []

    def applications(self, request: httpx.Request) -> httpx.Response:
        if request.method == "PUT":
            config = json.loads(request.content)
            self.pushes.append(config)
            self.apply(config)
            return httpx.Response(200, text="")
        return httpx.Response(200, json=self.payload)

    def apply(self, config: dict) -> None:
        apps = self.payload["applications"]
        stamp = max(app["last_deployed_time_s"] for app in apps.values()) + 1
        for sent in config["applications"]:
            app = apps[sent["name"]]
            app["deployed_app_config"] = copy.deepcopy(sent)
            app["last_deployed_time_s"] = stamp
            app["external_scaler_enabled"] = bool(sent.get("external_scaler_enabled"))
            # A deployment entry asking for it fails the application, as a bad import path does.
            failing = any((e.get("user_config") or {}).get("fail") for e in sent.get("deployments", []))
            app["status"], app["message"] = ("DEPLOY_FAILED", "boom") if failing else ("RUNNING", "")
            for entry in sent.get("deployments", []):
                dep = app["deployments"][entry["name"]]
                effective = dep["deployment_config"]
                if isinstance(entry.get("autoscaling_config"), dict):
                    effective["autoscaling_config"] = {
                        **(effective.get("autoscaling_config") or {}),
                        **entry["autoscaling_config"],
                    }
                    effective.pop("num_replicas", None)
                elif "num_replicas" in entry:
                    effective.pop("autoscaling_config", None)
                    effective["num_replicas"] = entry["num_replicas"]
                    dep["target_num_replicas"] = entry["num_replicas"]
                for key, value in entry.items():
                    if key not in ("name", "autoscaling_config", "num_replicas"):
                        effective[key] = value

    def scale(self, app: str, dep: str):
        def answer(request: httpx.Request) -> httpx.Response:
            if not self.payload["applications"][app].get("external_scaler_enabled"):
                return httpx.Response(
                    412,
                    json={
                        "error": f"Current recorded scaling policy not found for {app}/{dep}: external_scaler_enabled "
                        "is not set"
                    },
                )
            target = json.loads(request.content)["target_num_replicas"]
            self.scales.append((dep, target))
            self.payload["applications"][app]["deployments"][dep]["target_num_replicas"] = target
            return httpx.Response(200, json={"message": "ok"})

        return answer


@pytest.fixture
def ray(cluster, use_replay, settings):
    settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S = 5
    settings.FLEETDECK_CHANGE_POLL_S = 0.01
    fake = RayWithScaleApi()
    use_replay.routes["/api/serve/applications/"] = fake.applications
    for dep in ("Model", "Echo"):
        use_replay.routes[SCALE.format(app="demo", dep=dep)] = fake.scale("demo", dep)
    return fake


@pytest.fixture
def scaler(model, calibrated, operator) -> Scaler:
    return create_shadow_scaler(operator, model, min_replicas=1, max_replicas=8)


def entry(config: dict, app: str, dep: str) -> dict:
    application = next(a for a in config["applications"] if a["name"] == app)
    return next(d for d in application["deployments"] if d["name"] == dep)


def app_config(config: dict, app: str) -> dict:
    return next(a for a in config["applications"] if a["name"] == app)


def active(scaler: Scaler, operator) -> Scaler:
    change = control.activate(operator, scaler)
    protocol.run(change.pk)
    change.refresh_from_db()
    assert change.state == ChangeState.SUCCEEDED, change.error
    scaler.refresh_from_db()
    assert scaler.mode == Scaler.Mode.ACTIVE
    return scaler


# --- turning on ----------------------------------------------------------------------------------


def test_activating_plans_the_flag_and_a_fixed_count_and_turns_active_when_verified(scaler, operator, ray):
    change = control.activate(operator, scaler)

    assert change.kind == Change.Kind.SCALER and change.state == ChangeState.QUEUED
    assert not ray.pushes
    assert app_config(change.new_config, "demo")["external_scaler_enabled"] is True
    model = entry(change.new_config, "demo", "Model")
    # One replica runs; the scaler's bounds (1-8) and the memory ceiling (4) keep it.
    assert model["num_replicas"] == 1 and model["autoscaling_config"] is None
    assert entry(change.new_config, "demo", "Echo") == entry(change.base_config, "demo", "Echo")
    assert app_config(change.new_config, "echo2") == app_config(change.base_config, "echo2")
    scaler.refresh_from_db()
    # Serve's defaults left out: sending them back would rebuild the other deployments.
    assert scaler.autoscaling_config == {"max_replicas": 2, "target_ongoing_requests": 4.0}
    assert scaler.mode == Scaler.Mode.SHADOW and scaler.change_id == change.pk

    protocol.run(change.pk)

    change.refresh_from_db()
    assert change.state == ChangeState.SUCCEEDED, change.error
    scaler.refresh_from_db()
    assert (scaler.mode, scaler.target) == (Scaler.Mode.ACTIVE, 1)


def test_the_count_handed_over_never_exceeds_the_memory_ceiling(model, calibrated, operator):
    Deployment.objects.filter(pk=model.pk).update(running_replicas=10, target_replicas=10)
    scaler = create_shadow_scaler(operator, Deployment.objects.get(pk=model.pk), min_replicas=1, max_replicas=12)
    # Ten run (more than fit). Memory: (0.95 * 16 - 8 GiB + their 10 x 512 MiB at rest, less 20 %)
    # // 1.5 GiB at peak = 6 (1.8 free CPUs at 0.2 a replica would schedule nine): six are handed over.
    assert control.handover_count(scaler) == 6
    scaler.max_replicas = 2
    assert control.handover_count(scaler) == 2


def test_the_ceiling_keeps_the_margin_the_calibrations_rounds_measured(model, calibrated, operator):
    Deployment.objects.filter(pk=model.pk).update(running_replicas=10, target_replicas=10)
    calibrated.points = [
        {**p, "peak_samples": [p["peak_bytes"], p["peak_bytes"] - MIB, p["peak_bytes"] - 2 * MIB]}
        for p in calibrated.points
    ]
    calibrated.save(update_fields=["points"])
    scaler = create_shadow_scaler(operator, Deployment.objects.get(pk=model.pk), min_replicas=1, max_replicas=12)
    built = policies.build(scaler)
    # Steady rounds call for the 5 % floor, as the wizard keeps: (0.95 x 16 - 8 GiB + the ten at 512 MiB)
    # less 5 % // 1.5 GiB = 7, where the flat 20 % held 6.
    assert built.policy is not None and built.policy.memory_ceiling == 7, built
    assert "5% kept free, the floor" in built.ceiling_reason


def test_an_application_whose_other_deployment_autoscales_is_explained_and_nothing_is_planned(
    cluster, calibrated, operator, ray
):
    echo = Deployment.objects.get(application__cluster=cluster, application__name="demo", name="Echo")
    scaler = create_shadow_scaler(operator, echo, min_replicas=1, max_replicas=3, concurrency=4, service_s=0.5)

    with pytest.raises(ValidationError) as refused:
        control.activate(operator, scaler)

    message = " ".join(refused.value.messages)
    assert "Model" in message and "external_scaler_enabled" in message and "whole application" in message
    assert not Change.objects.exists() and not ray.pushes
    scaler.refresh_from_db()
    assert scaler.mode == Scaler.Mode.SHADOW and scaler.change is None


def test_a_ray_before_2_60_needs_the_scale_api_and_nothing_changes(cluster, scaler, operator, ray):
    Cluster.objects.filter(pk=cluster.pk).update(ray_version="2.50.1")
    scaler.refresh_from_db()

    with pytest.raises(ValidationError, match=r"needs Ray 2\.60's scale API"):
        control.activate(operator, scaler)

    assert not Change.objects.exists() and not ray.pushes


def test_verification_waits_for_the_application_to_report_the_flag():
    serve = parse_serve_status(ray_fixture("serve_applications_two_apps.json"))
    times = {"demo": None}
    verdict = planner.verify(serve, {}, times, {"demo": {"external_scaler_enabled": True}})
    assert not verdict.done
    assert "demo: external_scaler_enabled is not true yet" in verdict.waiting_for


# --- every push keeps the count ----------------------------------------------------------------


def test_a_change_to_another_option_of_the_deployment_keeps_the_scalers_count(scaler, operator, ray, cluster):
    active(scaler, operator)
    Scaler.objects.filter(pk=scaler.pk).update(target=3)  # what the tick sent since

    change = protocol.plan_change(
        operator,
        cluster,
        targets=[{"application": "demo", "deployment": "Model"}],
        options={"max_ongoing_requests": 6},
        reason="tune",
    )
    pushed_entry = entry(change.new_config, "demo", "Model")
    assert pushed_entry["num_replicas"] == 3 and pushed_entry["max_ongoing_requests"] == 6
    assert app_config(change.new_config, "demo")["external_scaler_enabled"] is True
    assert any("num_replicas 3, the count its scaler set" in w for w in change.warnings)

    protocol.request_apply(operator, change)
    protocol.run(change.pk)

    change.refresh_from_db()
    assert change.state == ChangeState.SUCCEEDED, change.error
    assert entry(ray.pushes[-1], "demo", "Model")["num_replicas"] == 3


def test_a_rollback_keeps_the_scalers_count_too(scaler, operator, ray, cluster):
    active(scaler, operator)
    Scaler.objects.filter(pk=scaler.pk).update(target=3)
    change = protocol.plan_change(
        operator,
        cluster,
        targets=[{"application": "demo", "deployment": "Model"}],
        options={"user_config": {"fail": True}},
        reason="bad",
    )
    protocol.request_apply(operator, change)
    protocol.run(change.pk)

    change.refresh_from_db()
    assert change.state == ChangeState.ROLLED_BACK, change.error
    back = ray.pushes[-1]
    # The base config as planned said 1 (the count at activation); the way back keeps 3.
    assert entry(change.base_config, "demo", "Model")["num_replicas"] == 1
    assert entry(back, "demo", "Model")["num_replicas"] == 3
    assert app_config(back, "demo")["external_scaler_enabled"] is True


def test_pinning_leaves_configs_without_the_flag_and_autoscaled_entries_alone():
    config = {
        "applications": [
            {"name": "a", "deployments": [{"name": "D", "num_replicas": 1}]},
            {"name": "b", "external_scaler_enabled": True, "deployments": [{"name": "D", "autoscaling_config": {}}]},
            {"name": "c", "external_scaler_enabled": True, "deployments": []},
        ]
    }
    pinned, notes = control.pin(config, {("a", "D"): 3, ("b", "D"): 3, ("c", "D"): 2})
    assert pinned["applications"][0] == config["applications"][0]
    assert pinned["applications"][1] == config["applications"][1]
    assert pinned["applications"][2]["deployments"] == [{"name": "D", "num_replicas": 2}]
    assert len(notes) == 1


# --- acting ----------------------------------------------------------------------------------------


def test_the_tick_sends_an_active_scalers_new_target_through_the_scale_api(scaler, model, operator, ray):
    active(scaler, operator)
    record_readings(model, [2, 2, 2, 24])  # 12 in flight at 4 per replica: three replicas

    row = shadow.evaluate(scaler.pk)

    assert row.kind == ScalerDecision.Kind.UP and row.target == 3 and row.applied and not row.error
    assert ray.scales == [("Model", 3)]
    scaler.refresh_from_db()
    assert scaler.target == 3

    # The same reading again: the count is already sent, nothing new is asked.
    Scaler.objects.filter(pk=scaler.pk).update(evaluated_at=None)
    shadow.evaluate(scaler.pk)
    assert ray.scales == [("Model", 3)]


def test_a_412_marks_the_scaler_for_attention_and_it_stops_sending(scaler, model, operator, ray):
    active(scaler, operator)
    # Someone pushed the application without the flag.
    ray.payload["applications"]["demo"]["external_scaler_enabled"] = False
    record_readings(model, [2, 2, 2, 24])

    row = shadow.evaluate(scaler.pk)

    assert not row.applied and "HTTP 412" in row.error
    scaler.refresh_from_db()
    assert "Ray refused the count" in scaler.attention and scaler.target == 1
    record_readings(model, [2, 2, 2, 24, 40])
    Scaler.objects.filter(pk=scaler.pk).update(evaluated_at=None)
    shadow.evaluate(scaler.pk)
    assert ray.scales == []


def test_a_shadow_scaler_never_calls_the_scale_api(scaler, model, ray):
    record_readings(model, [2, 2, 2, 24])
    row = shadow.evaluate(scaler.pk)
    assert row.kind == ScalerDecision.Kind.UP and not row.applied and ray.scales == []


# --- the watchdog and turning off -----------------------------------------------------------------


def test_stale_signals_hand_the_deployment_back_with_a_sized_autoscaling_config(scaler, model, operator, ray):
    active(scaler, operator)
    record_readings(model, [2, 2, 24], end=time.time() - 600)

    assert shadow.evaluate(scaler.pk) is None

    scaler.refresh_from_db()
    assert scaler.mode == Scaler.Mode.HANDING_BACK and scaler.change_purpose == Scaler.Purpose.HAND_BACK
    (why,) = scaler.decisions.filter(kind=ScalerDecision.Kind.HAND_BACK)
    assert "Handed back to Serve's autoscaler" in why.reason and "600 s old" in why.reason
    change = scaler.change
    assert change.kind == Change.Kind.SCALER and change.state == ChangeState.QUEUED
    assert change.created_by is None  # the watchdog, not a person
    assert "external_scaler_enabled" not in app_config(change.new_config, "demo")
    # Sized from the calibration: the scaler's bounds under the memory ceiling of 4, scaling out at
    # half the 4 requests a replica holds.
    assert entry(change.new_config, "demo", "Model")["autoscaling_config"] == {
        "min_replicas": 1,
        "max_replicas": 4,
        "target_ongoing_requests": 2,
    }
    assert "num_replicas" not in entry(change.new_config, "demo", "Model")

    # At most one hand-back at a time: a scaler handing back is not decided for.
    assert shadow.evaluate(scaler.pk) is None
    assert Change.objects.filter(kind=Change.Kind.SCALER).count() == 2

    protocol.run(change.pk)
    change.refresh_from_db()
    assert change.state == ChangeState.SUCCEEDED, change.error
    scaler.refresh_from_db()
    assert (scaler.mode, scaler.target) == (Scaler.Mode.OFF, None)


def test_a_watch_that_lapsed_while_the_worker_was_down_hands_back(scaler, model, operator, ray, settings):
    active(scaler, operator)
    record_readings(model, [2, 2, 24])
    Scaler.objects.filter(pk=scaler.pk).update(
        evaluated_at=timezone.now() - timedelta(seconds=10 * settings.FLEETDECK_SYNC_INTERVAL_S)
    )

    shadow.evaluate(scaler.pk)

    scaler.refresh_from_db()
    assert scaler.mode == Scaler.Mode.HANDING_BACK
    assert "the worker was down" in scaler.decisions.get(kind=ScalerDecision.Kind.HAND_BACK).reason


def test_turning_on_and_off_through_the_api(scaler, ray, api_as):
    client = api_as("operator")
    answer = client.post(f"/api/v1/scalers/{scaler.pk}/activate/")
    assert answer.status_code == 202, answer.content
    change = Change.objects.get(pk=answer.json()["change"])
    protocol.run(change.pk)
    scaler.refresh_from_db()
    assert scaler.mode == Scaler.Mode.ACTIVE

    again = client.post(f"/api/v1/scalers/{scaler.pk}/activate/")
    assert again.status_code == 400 and "active" in json.dumps(again.json())

    kept = client.delete(f"/api/v1/scalers/{scaler.pk}/")
    assert kept.status_code == 400 and "turn it off first" in json.dumps(kept.json())

    off = client.post(f"/api/v1/scalers/{scaler.pk}/deactivate/")
    assert off.status_code == 202, off.content
    protocol.run(off.json()["change"])
    scaler.refresh_from_db()
    assert scaler.mode == Scaler.Mode.OFF
    assert "external_scaler_enabled" not in ray.pushes[-1]["applications"][0]
