"""The local demo's OOM story without a real Ray: the memory-monitor threshold `make run` derives
from FLEETDECK_OOM_HEADROOM_GIB, and `manage.py demo_config` switching the reference app between
its shipped configs through the change protocol, against a replayed dashboard that keeps state."""

from __future__ import annotations

import copy
import io
import json
import time

import httpx
import pytest
from django.core.management import CommandError, call_command

from apps.accounts.models import AuditEvent
from apps.changes.models import Change, ChangeState
from apps.demo.local_ray import GIB, REFERENCE_APP_DIR, memory_monitor_env, memory_usage, threshold_for_headroom
from apps.demo.management.commands.runlocal import memory_monitor_line, oom_headroom_gib
from tests.conftest import ray_fixture
from tests.factories import ClusterFactory

# --- the memory monitor's threshold ---------------------------------------------------------


def test_the_threshold_lies_the_headroom_above_what_the_machine_uses():
    usage = (6 * GIB, 24 * GIB)
    threshold = threshold_for_headroom(3, usage)
    assert threshold == 0.375  # (6 + 3) / 24
    assert memory_monitor_env(threshold) == {
        "RAY_memory_usage_threshold": "0.375",
        "RAY_memory_monitor_refresh_ms": "250",
    }
    assert (
        memory_monitor_line(threshold, usage, 3) == "Ray memory monitor: kills above 9.0 GiB used (3.0 GiB above now)"
    )


def test_a_headroom_past_rays_default_is_capped_and_says_so():
    usage = (20 * GIB, 24 * GIB)
    threshold = threshold_for_headroom(3, usage)
    assert threshold == 0.95
    line = memory_monitor_line(threshold, usage, 3)
    assert "kills above 22.8 GiB used (2.8 GiB above now)" in line and "capped at Ray's default, 95%" in line


def test_the_threshold_is_rounded_to_what_ray_is_given():
    threshold = threshold_for_headroom(1, (1 * GIB, 7 * GIB))
    assert threshold == round(2 / 7, 3) and memory_monitor_env(threshold)["RAY_memory_usage_threshold"] == "0.286"


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf")])
def test_the_helper_refuses_a_headroom_that_is_not_positive(bad):
    with pytest.raises(ValueError, match="positive number of GiB"):
        threshold_for_headroom(bad, (GIB, 8 * GIB))


def test_this_machines_usage_is_read_from_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(
        "MemTotal:       24000000 kB\nMemFree:         1000000 kB\nMemAvailable:   18000000 kB\n"
        "HugePages_Total:       0\n"
    )
    assert memory_usage(meminfo) == (6000000 * 1024, 24000000 * 1024)
    used, total = memory_usage()
    assert 0 < used < total


@pytest.mark.parametrize(
    "value, gib", [(None, None), ("", None), ("  ", None), ("3", 3.0), ("0.5", 0.5), (" 2.5 ", 2.5)]
)
def test_the_environment_variable_is_read_as_gib(value, gib):
    assert oom_headroom_gib(value) == gib


@pytest.mark.parametrize(
    "value, message",
    [
        ("three", "must be a number of GiB, e.g. FLEETDECK_OOM_HEADROOM_GIB=3; got 'three'"),
        ("3GiB", "must be a number of GiB"),
        ("0", "must be more than 0 GiB"),
        ("-2", "must be more than 0 GiB"),
        ("nan", "must be more than 0 GiB"),
        ("inf", "must be more than 0 GiB"),
    ],
)
def test_a_bad_environment_variable_is_a_clear_error(value, message):
    with pytest.raises(CommandError, match=message.replace("(", r"\(")):
        oom_headroom_gib(value)


def test_runlocal_stops_on_a_bad_headroom_before_starting_anything(monkeypatch):
    from apps.demo.local_ray import LocalRayHead

    monkeypatch.setenv("FLEETDECK_OOM_HEADROOM_GIB", "lots")
    monkeypatch.setattr(LocalRayHead, "start", lambda **kwargs: pytest.fail("a head was started"))
    with pytest.raises(CommandError, match="FLEETDECK_OOM_HEADROOM_GIB must be a number"):
        call_command("runlocal")


# --- demo_config ----------------------------------------------------------------------------


def shipped(name: str) -> dict:
    return json.loads((REFERENCE_APP_DIR / f"{name}.json").read_text())["applications"][0]


class ReferenceRay:
    """A dashboard serving only the reference app, shaped like Ray 2.60's payloads: a PUT replaces
    the submitted config, the effective deployment configs and the deploy time, as Ray does."""

    def __init__(self, config: dict):
        self.serve = ray_fixture("serve_applications_two_apps.json")
        template = self.serve["applications"]["demo"]
        self.deployment_template = template["deployments"]["Model"]
        self.serve["applications"] = {
            "reference": {
                **copy.deepcopy(template),
                "name": "reference",
                "route_prefix": "/reference",
                "deployment_topology": None,
                "deployments": {},
            }
        }
        self.puts: list[dict] = []
        self.apply(config)

    def apply(self, app: dict) -> None:
        served = self.serve["applications"]["reference"]
        served["deployed_app_config"] = copy.deepcopy(app)
        served["last_deployed_time_s"] = time.time()
        served["deployments"] = {
            entry["name"]: {
                **copy.deepcopy(self.deployment_template),
                "name": entry["name"],
                "deployment_config": {
                    **copy.deepcopy(self.deployment_template["deployment_config"]),
                    **copy.deepcopy(entry),
                },
            }
            for entry in app["deployments"]
        }

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "PUT":
            config = json.loads(request.content)
            self.puts.append(config)
            self.apply(next(app for app in config["applications"] if app["name"] == "reference"))
            return httpx.Response(200)
        return httpx.Response(200, json=self.serve)


@pytest.fixture
def demo(db, team, use_replay, settings):
    settings.FLEETDECK_CHANGE_POLL_S = 0.05
    ray = ReferenceRay(shipped("reference"))
    use_replay.routes["/api/serve/applications/"] = ray
    ClusterFactory(name="local-demo", team=team)
    return ray


def demo_config(*args) -> str:
    out = io.StringIO()
    call_command("demo_config", *args, stdout=out)
    return out.getvalue()


def test_demo_config_switches_the_reference_app_through_an_audited_verified_change(demo):
    output = demo_config("misbehaving")

    change = Change.objects.get()
    assert change.state == ChangeState.SUCCEEDED and change.kind == Change.Kind.RESTORE
    assert change.reason == "Demo: switch reference to deploy/reference_app/misbehaving.json"
    assert change.new_config["applications"] == [shipped("misbehaving")]
    assert [config["applications"] for config in demo.puts] == [[shipped("misbehaving")]]
    assert {"change.plan", "change.apply"} <= set(AuditEvent.objects.values_list("action", flat=True))
    assert f"Change #{change.pk} on local-demo (/changes/{change.pk}/ in Fleetdeck):" in output
    assert "replace /applications/0/deployments/0/max_ongoing_requests 16" in output
    assert f"reference on local-demo runs misbehaving.json: change #{change.pk} verified." in output

    demo_config("reference")
    assert Change.objects.latest("pk").state == ChangeState.SUCCEEDED
    assert demo.serve["applications"]["reference"]["deployed_app_config"] == shipped("reference")


def test_demo_config_refuses_a_switch_to_the_config_already_running(demo):
    with pytest.raises(CommandError, match="already runs exactly that config"):
        demo_config("reference")
    assert not Change.objects.exists() and not demo.puts


def test_demo_config_names_what_is_missing(db, team):
    with pytest.raises(CommandError, match="No cluster named 'local-demo': start `make run` first"):
        demo_config("misbehaving")
    with pytest.raises(CommandError, match="invalid choice"):
        demo_config("broken")


def test_demo_config_reports_a_change_that_did_not_verify(demo, settings, monkeypatch):
    settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S = 0.3
    apply, lost = demo.apply, []
    # Ray accepts the first PUT and never applies it; the rollback's PUT goes through.
    monkeypatch.setattr(demo, "apply", lambda app: apply(app) if lost else lost.append(app))

    with pytest.raises(CommandError, match=r"Change #\d+ rolled back: Not verified within 0.3 s"):
        demo_config("misbehaving")
