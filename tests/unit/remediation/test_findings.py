"""Config lint on configs replayed from a real cluster: each rule fires where it should, and only there."""

from __future__ import annotations

import copy
from urllib.parse import parse_qs, urlsplit

import pytest
from django.urls import reverse

from apps.accounts.audit import Actor
from apps.accounts.models import AuditEvent
from apps.clusters.models import Cluster
from apps.fleet import sync
from apps.remediation import findings, rules
from apps.remediation.models import Finding
from apps.remediation.views import fix_url
from tests.conftest import ray_fixture

pytestmark = pytest.mark.django_db


def subject(effective: dict, submitted: dict | None = None, **facts) -> rules.Subject:
    return rules.Subject(
        cluster_name="c",
        ray_version="2.60.0",
        application="demo",
        deployment="Model",
        effective=effective,
        submitted=submitted or {},
        **facts,
    )


def model_effective() -> dict:
    return copy.deepcopy(
        ray_fixture("serve_applications_two_apps.json")["applications"]["demo"]["deployments"]["Model"][
            "deployment_config"
        ]
    )


def hits(s: rules.Subject) -> dict[str, rules.Hit]:
    return {hit.rule: hit for hit in rules.evaluate(s)}


def test_a_gpu_deployment_taking_8_at_once_gets_r1_and_r2_with_patches():
    effective = model_effective()
    effective["ray_actor_options"]["num_gpus"] = 1
    found = hits(subject(effective, running_replicas=1))
    assert found["gpu-concurrency"].patch == {
        "max_ongoing_requests": 2,
        "autoscaling_config": {"target_ongoing_requests": 1},
    }
    assert found["heavy-autoscaling"].patch == {"autoscaling_config": {"target_ongoing_requests": 1}}


def test_a_cpu_deployment_is_not_held_to_gpu_rules():
    found = hits(subject(model_effective(), running_replicas=2))
    assert "gpu-concurrency" not in found and "heavy-autoscaling" not in found


def test_an_unbounded_queue_gets_a_bound_from_the_deployments_own_concurrency():
    effective = model_effective() | {"max_queued_requests": -1}
    assert hits(subject(effective))["unbounded-queue"].patch == {"max_queued_requests": 4 * 8 * 2}
    assert "unbounded-queue" not in hits(subject(model_effective()))


def test_one_replica_without_surge_or_with_a_recycle_schedule_is_flagged():
    assert hits(subject(model_effective()))["single-replica"].patch == {"autoscaling_config": {"min_replicas": 2}}
    surged = model_effective() | {"max_surge_percent": 100}
    assert "single-replica" not in hits(subject(surged))
    assert "single-replica" in hits(subject(surged, has_recycle_schedule=True))
    two = model_effective()
    two["autoscaling_config"]["min_replicas"] = 2
    assert "single-replica" not in hits(subject(two))


def test_a_cap_below_the_target_is_flagged():
    low = model_effective() | {"max_ongoing_requests": 2}
    assert hits(subject(low))["cap-below-target"].patch == {"autoscaling_config": {"target_ongoing_requests": 2}}


def test_a_short_downscale_matters_only_when_cold_starts_are_seen():
    quick = model_effective()
    quick["autoscaling_config"]["downscale_delay_s"] = 10
    assert "short-downscale" not in hits(subject(quick))
    assert hits(subject(quick, cold_starts_observed=True))["short-downscale"].patch == {
        "autoscaling_config": {"downscale_delay_s": 300}
    }


def test_settings_serve_ignores_are_found_by_comparing_with_what_runs():
    found = hits(
        subject(
            model_effective(),
            {"name": "Model", "max_concurrent_queries": 2, "autoscaling_config": {"max_ongoing_requests": 3}},
        )
    )
    hit = found["ignored-settings"]
    assert any("2.10" in problem for problem in hit.evidence["ignored"])
    assert hit.patch["max_concurrent_queries"] is None and hit.patch["autoscaling_config"] == {
        "max_ongoing_requests": None
    }
    assert "ignored-settings" not in hits(subject(model_effective(), {"name": "Model", "max_ongoing_requests": 8}))


def test_ratchets_and_cold_starts_point_to_schedules_and_warmups():
    assert hits(subject(model_effective(), memory_ratchet=True))["recycle-missing"].action == "schedule"
    assert "recycle-missing" not in hits(subject(model_effective(), memory_ratchet=True, has_recycle_schedule=True))
    assert hits(subject(model_effective(), cold_start_ratio=12.0))["warmup-missing"].action == "warmup"
    assert "warmup-missing" not in hits(subject(model_effective(), cold_start_ratio=12.0, has_warmup=True))
    assert "warmup-missing" not in hits(subject(model_effective(), cold_start_ratio=2.0))


@pytest.fixture
def cluster(team, use_replay):
    cluster = Cluster.objects.create(
        name="vision-prod", team=team, dashboard_url="http://ray.test:8265", ray_version="2.60.0", auth_mode="disabled"
    )
    sync.sync_cluster(cluster.pk)
    return cluster


def test_recompute_opens_findings_once_and_resolves_them_when_fixed(cluster, use_replay):
    assert findings.recompute(cluster.pk)["opened"] > 0
    open_rules = set(Finding.objects.filter(cluster=cluster).values_list("application_name", "deployment_name", "rule"))
    assert ("echo2", "Echo", "unbounded-queue") in open_rules and ("", "", "dashboard-auth") in open_rules
    assert findings.recompute(cluster.pk) == {"opened": 0, "resolved": 0}

    payload = ray_fixture("serve_applications_two_apps.json")
    payload["applications"]["echo2"]["deployments"]["Echo"]["deployment_config"]["max_queued_requests"] = 20
    use_replay.routes["/api/serve/applications/"] = payload
    sync.sync_cluster(cluster.pk)
    assert findings.recompute(cluster.pk)["resolved"] == 1
    assert Finding.objects.get(application_name="echo2", rule="unbounded-queue").resolved_at is not None


def test_plan_this_fix_opens_the_planner_prefilled(cluster, client, people):
    findings.recompute(cluster.pk)
    finding = Finding.objects.get(application_name="echo2", rule="unbounded-queue")
    url = fix_url(finding)
    query = parse_qs(urlsplit(url).query)
    assert query["target"] == ["echo2/Echo"] and query["options"] == ["max_queued_requests: 20\n"]
    client.force_login(people["operator"])
    page = client.get(url).content.decode()
    assert "max_queued_requests: 20" in page and 'value="echo2/Echo"' in page and "Finding: Unbounded queue" in page
    fleet = client.get(reverse("remediation:findings")).content.decode()
    assert "Unbounded queue" in fleet and "Plan this fix" in fleet and "Ray dashboard without authentication" in fleet


def test_muting_needs_a_reason_is_audited_and_hides_the_finding(cluster, api_as):
    findings.recompute(cluster.pk)
    finding = Finding.objects.get(application_name="echo2", rule="unbounded-queue")
    operator = api_as("operator")
    assert operator.post(f"/api/v1/findings/{finding.pk}/mute/", {}, format="json").status_code == 400
    assert (
        api_as("viewer").post(f"/api/v1/findings/{finding.pk}/mute/", {"reason": "x"}, format="json").status_code == 403
    )
    muted = operator.post(
        f"/api/v1/findings/{finding.pk}/mute/", {"reason": "echo2 is a canary, sheds load upstream"}, format="json"
    ).json()
    assert muted["muted_at"] and AuditEvent.objects.filter(action="finding.mute").exists()
    listed = api_as("viewer").get("/api/v1/findings/?muted=false&rule=unbounded-queue").json()["results"]
    assert finding.pk not in [f["id"] for f in listed]
    assert operator.post(f"/api/v1/findings/{finding.pk}/unmute/").json()["muted_at"] is None
    detail = api_as("viewer").get(f"/api/v1/findings/{finding.pk}/").json()
    assert detail["why"].startswith("An unbounded queue") and detail["remedy"] == "R10"


def test_muted_means_only_muted_in_the_api_and_muted_as_well_on_the_page(cluster, client, people, api_as):
    findings.recompute(cluster.pk)
    finding = Finding.objects.get(application_name="echo2", rule="unbounded-queue")
    findings.mute(Actor(people["operator"]), finding, "a canary")
    others = set(Finding.objects.filter(resolved_at__isnull=True, muted_at__isnull=True).values_list("pk", flat=True))
    viewer = api_as("viewer")

    def listed(query: str) -> set[int]:
        return {f["id"] for f in viewer.get(f"/api/v1/findings/?{query}").json()["results"]}

    assert listed("muted=true") == {finding.pk}
    assert listed("muted=false") == others
    assert listed("") == others | {finding.pk}
    client.force_login(people["operator"])  # who sees the mute reason
    assert "a canary" not in client.get(reverse("remediation:findings")).content.decode()
    # The page's own word for "show them too" is 1; the API's true does nothing here.
    assert "a canary" not in client.get(reverse("remediation:findings"), {"muted": "true"}).content.decode()
    shown = client.get(reverse("remediation:findings"), {"muted": "1"}).content.decode()
    assert "a canary" in shown and "Ray dashboard without authentication" in shown


def test_a_rule_with_many_places_shows_its_first_ones_and_pages_through_all(cluster, client, people):
    from apps.remediation import views

    findings.recompute(cluster.pk)
    many = views.FINDINGS_PER_GROUP + 5
    Finding.objects.bulk_create(
        [
            Finding(
                cluster=cluster,
                cluster_name=cluster.name,
                application_name=f"app{i:03}",
                deployment_name="Model",
                rule="unbounded-queue",
                severity="minor",
                message="no bound",
            )
            for i in range(many)
        ]
    )
    total = Finding.objects.filter(rule="unbounded-queue", resolved_at__isnull=True).count()
    client.force_login(people["viewer"])

    fleet = client.get(reverse("remediation:findings")).content.decode()
    assert f"{total} places" in fleet and f"Show all {total} places" in fleet
    assert fleet.count("app0") == views.FINDINGS_PER_GROUP  # the first places, in order
    assert "Ray dashboard without authentication" in fleet  # other rules still listed

    one = client.get(reverse("remediation:findings"), {"rule": "unbounded-queue"}).content.decode()
    assert one.count("app0") == many and "Show all" not in one and "Ray dashboard without authentication" not in one
    assert "← Every rule" in one
    # An unknown rule is the whole page, not an error.
    assert client.get(reverse("remediation:findings"), {"rule": "nope"}).status_code == 200


def test_findings_list_by_rule_then_cluster_name_whatever_order_the_clusters_came_in(cluster, api_as):
    """The lists sort by the name kept on each finding: reconcile writes it, and a finding saved
    on its own fills it."""
    later = Cluster.objects.create(name="aaa-registered-later", team=cluster.team, dashboard_url="http://10.0.0.9:8265")
    for c in (cluster, later):
        Finding.objects.create(cluster=c, application_name="app", deployment_name="Model", rule="unbounded-queue")
    findings.recompute(cluster.pk)
    assert set(Finding.objects.filter(cluster=cluster).values_list("cluster_name", flat=True)) == {cluster.name}

    rows = api_as("admin").get(reverse("finding-list"), {"rule": "unbounded-queue"}).json()["results"]
    names = [row["cluster_name"] for row in rows]
    assert names[0] == "aaa-registered-later" and names == sorted(names) and cluster.name in names
