"""R4's batch limit and R3's input caps, sized from a token-sum calibration and written to
user_config."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.calibration import services as calibration
from apps.calibration.curve import Curve
from apps.calibration.models import MemoryCalibration
from apps.changes.models import Change
from apps.fleet import sync
from apps.remediation import wizards
from apps.remediation.models import Wizard
from tests.unit.remediation.wizard_helpers import (
    MIB,
    actor,
    by_remedy,
    calibrate,
)

pytestmark = pytest.mark.django_db


TOKEN_CAPS = {"max_prompt_tokens": 512, "max_tokens_cap": 128}


def run_with_user_config(live, cluster, user_config: dict) -> None:
    """The Model deployment now runs `user_config` (submitted and effective), and Fleetdeck has synced it."""
    live.model()["user_config"] = user_config
    entry = next(
        d for d in live.payload["applications"]["demo"]["deployed_app_config"]["deployments"] if d["name"] == "Model"
    )
    entry["user_config"] = dict(user_config)
    assert sync.sync_cluster(cluster.pk).ok


def token_calibration(deployment, mib_per_token: int = 1, baseline_mib: int = 300) -> Curve:
    """A finished token-sum calibration: `mib_per_token` per token of a batch, on top of the replica at rest."""
    points = [{"x": n, "peak_bytes": (baseline_mib + n * mib_per_token) * MIB} for n in (256, 1024, 4096)]
    row = MemoryCalibration.objects.create(
        deployment=deployment,
        cluster=deployment.application.cluster,
        application_name="demo",
        deployment_name="Model",
        submission_id=f"token-{MemoryCalibration.objects.count()}",
        state="succeeded",
        axis="token_sum",
        device="cpu",
        baseline_bytes=baseline_mib * MIB,
        points=points,
        monotone=True,
        levels=[256, 1024, 4096],
        finished_at=timezone.now(),
    )
    return calibration.curve_of(row)


def share_of(wizard: Wizard) -> int:
    """One replica's share of the node budget, as the diagnosis found it."""
    return wizard.diagnosis["budget"]["bytes_per_node"] // by_remedy(wizard)["R1"].values["replicas_per_node"]


def test_a_token_sum_calibration_gives_r4_the_largest_fitting_batch_limit_applied_as_a_user_config_change(
    people, incident, live, cluster
):
    run_with_user_config(live, cluster, {"alloc_mb": 0, "hold_s": 0.05, **TOKEN_CAPS, "max_batch_tokens": 65536})
    curve = token_calibration(incident.deployment)
    wizard, _ = wizards.start(actor(people), incident=incident)
    # A request is priced at its caps: 640 tokens at 1 MiB each.
    memory = wizard.diagnosis["memory"]
    assert memory["per_request_bytes"] == 640 * MIB and "max_prompt_tokens 512 + max_tokens_cap 128" in memory["reason"]
    r4 = by_remedy(wizard)["R4"]
    limit = r4.patch["user_config"]["max_batch_tokens"]
    assert r4.kind == "config" and r4.status == "pending" and r4.patch == {"user_config": {"max_batch_tokens": limit}}
    assert curve.peak_at(limit) <= share_of(wizard) < curve.peak_at(limit + 1)
    assert f"{limit}: a batch of {limit} tokens" in r4.values["reasons"]["max_batch_tokens"]

    change = wizards.apply(actor(people), wizard, [r4.position], revision=wizard.revision)
    assert change.patch == {"user_config": {"max_batch_tokens": limit}}
    model = next(d for d in change.new_config["applications"][0]["deployments"] if d["name"] == "Model")
    # Serve replaces user_config wholesale: the pushed one keeps every other key.
    assert model["user_config"] == {"alloc_mb": 0, "hold_s": 0.05, **TOKEN_CAPS, "max_batch_tokens": limit}


def test_a_batch_limit_already_lower_than_computed_leaves_r4_not_applicable(people, incident, live, cluster):
    run_with_user_config(live, cluster, {**TOKEN_CAPS, "max_batch_tokens": 700})
    token_calibration(incident.deployment)
    r4 = by_remedy(wizards.start(actor(people), incident=incident)[0])["R4"]
    assert (
        r4.kind == "config" and r4.status == "not_applicable" and r4.patch == {"user_config": {"max_batch_tokens": 700}}
    )
    assert "It is already 700, lower than computed: kept." in r4.values["reasons"]["max_batch_tokens"]


def test_without_a_max_batch_tokens_key_r4_stays_a_checklist_that_shows_the_computed_limit(
    client, people, incident, live, cluster
):
    run_with_user_config(live, cluster, {"alloc_mb": 0, "hold_s": 0.05})
    curve = token_calibration(incident.deployment)
    wizard, _ = wizards.start(actor(people), incident=incident)
    r4 = by_remedy(wizard)["R4"]
    assert r4.kind == "checklist" and r4.patch is None and "calibration_batch(token_sum)" in r4.values["guidance"]
    [row] = r4.values["computed"]
    # No caps: a request is taken to be as large as the largest calibrated batch (conservative).
    assert "as large as the largest calibrated batch, 4096 tokens" in wizard.diagnosis["memory"]["reason"]
    assert row["option"] == "max_batch_tokens" and curve.peak_at(row["value"]) <= share_of(wizard) < curve.peak_at(
        row["value"] + 1
    )
    client.force_login(people["viewer"])
    page = client.get(reverse("remediation:wizard", args=[wizard.pk]), {"step": r4.position}).content.decode()
    assert (
        "Computed value" in page and f"<strong>{row['value']}</strong>" in page and row["reason"].split(";")[0] in page
    )


def test_a_token_calibration_made_after_the_start_turns_r4_into_a_config_step_on_replan(
    people, incident, live, cluster
):
    run_with_user_config(live, cluster, {**TOKEN_CAPS, "max_batch_tokens": 65536})
    wizard, _ = wizards.start(actor(people), incident=incident)
    assert by_remedy(wizard)["R4"].kind == "checklist" and "computed" not in by_remedy(wizard)["R4"].values
    token_calibration(incident.deployment)
    wizards.replan(actor(people), wizard, revision=wizard.revision)
    r4 = by_remedy(wizard)["R4"]
    assert r4.kind == "config" and r4.status == "pending" and r4.patch["user_config"]["max_batch_tokens"] < 65536
    assert [s.remedy for s in wizard.steps.all() if s.remedy].count("R4") == 1


def test_changed_token_caps_make_the_wizard_replan_instead_of_apply(people, incident, live, cluster):
    run_with_user_config(live, cluster, {**TOKEN_CAPS, "max_batch_tokens": 65536})
    token_calibration(incident.deployment)
    wizard, _ = wizards.start(actor(people), incident=incident)
    live.model()["user_config"] = {**TOKEN_CAPS, "max_tokens_cap": 1024, "max_batch_tokens": 65536}
    with pytest.raises(wizards.WizardStale, match="user_config"):
        wizards.apply(actor(people), wizard, [by_remedy(wizard)["R4"].position], revision=wizard.revision)
    wizard.refresh_from_db()
    # Re-planned from the live caps: a request now brings 1,536 tokens.
    assert wizard.diagnosis["memory"]["per_request_bytes"] == 1536 * MIB and not Change.objects.exists()


# --- R3 where the deployment reads its input caps from user_config ------------------------------


def test_input_caps_read_from_user_config_make_r3_a_config_step_sized_from_a_token_calibration(
    people, incident, live, cluster
):
    # 10,240 tokens at 1 MiB each: not even one such request fits the node's budget.
    run_with_user_config(
        live, cluster, {"alloc_mb": 0, "max_prompt_tokens": 8192, "max_tokens_cap": 2048, "max_batch_tokens": 65536}
    )
    token_calibration(incident.deployment)
    wizard, _ = wizards.start(actor(people), incident=incident)
    r3 = by_remedy(wizard)["R3"]
    assert r3.kind == "config" and r3.status == "pending"
    caps = r3.patch["user_config"]
    assert set(caps) == {"max_prompt_tokens", "max_tokens_cap"}
    # The most tokens a replica's share holds at R1's concurrency, less the replica at rest, at 1 MiB a token; split 4:1
    # as before.
    plan, budget = wizard.diagnosis["plan"], wizard.diagnosis["budget"]["bytes_per_node"]
    fit = (budget // plan["per_node"] - wizard.diagnosis["memory"]["baseline_bytes"]) // (plan["concurrency"] * MIB)
    assert caps["max_prompt_tokens"] + caps["max_tokens_cap"] == fit < 8192 + 2048
    assert caps["max_prompt_tokens"] == fit * 8192 // 10240
    assert r3.values["reasons"]["max_tokens_cap"].startswith(f"{caps['max_tokens_cap']}, down from 2048:")

    change = wizards.apply(actor(people), wizard, [r3.position], revision=wizard.revision)
    model = next(d for d in change.new_config["applications"][0]["deployments"] if d["name"] == "Model")
    assert model["user_config"] == {"alloc_mb": 0, "max_batch_tokens": 65536, **caps}


def test_caps_below_the_batch_limit_are_lowered_to_it_and_caps_that_fit_are_kept(people, incident, live, cluster):
    # A batch never holds more than 500 tokens: a request of 640 could never join one.
    run_with_user_config(live, cluster, {**TOKEN_CAPS, "max_batch_tokens": 500})
    token_calibration(incident.deployment)
    wizard, _ = wizards.start(actor(people), incident=incident)
    r3 = by_remedy(wizard)["R3"]
    assert r3.patch == {"user_config": {"max_prompt_tokens": 400, "max_tokens_cap": 100}}
    assert "batch limit of 500 tokens (R4)" in r3.values["reasons"]["max_prompt_tokens"]

    small = {"max_prompt_tokens": 64, "max_tokens_cap": 16}
    run_with_user_config(live, cluster, {**small, "max_batch_tokens": 500})
    wizards.replan(actor(people), wizard, revision=wizard.revision)
    r3 = by_remedy(wizard)["R3"]
    # Never raised: caps that fit stay as they are.
    assert r3.kind == "config" and r3.status == "not_applicable" and r3.patch == {"user_config": small}
    assert r3.values["reasons"]["max_prompt_tokens"].startswith("64, kept: a request brings at most 80 tokens")


def test_without_a_per_token_measurement_r3_is_a_config_step_that_says_why_it_has_no_values(
    people, incident, live, cluster
):
    run_with_user_config(live, cluster, {"alloc_mb": 0, **TOKEN_CAPS})
    wizard, _ = wizards.start(actor(people), incident=incident)
    r3 = by_remedy(wizard)["R3"]
    assert r3.kind == "config" and r3.patch is None and r3.values["waiting"]
    assert r3.note.startswith("No caps are computed: memory per token is not measured")
    with pytest.raises(wizards.WizardError, match="no values yet: No caps are computed"):
        wizards.apply(actor(people), wizard, [r3.position], revision=None)

    # A concurrency calibration measures memory per request, not per token: still no caps.
    calibrated = calibrate(cluster)
    wizards.replan(actor(people), wizard, revision=wizard.revision)
    r3 = by_remedy(wizard)["R3"]
    assert r3.kind == "config" and r3.patch is None
    assert f"calibration #{calibrated.pk} measured memory per request, not per token" in r3.note
    assert not Change.objects.exists()


def test_a_deployment_reading_only_one_cap_from_user_config_keeps_r3_a_checklist_that_says_so(
    people, incident, live, cluster
):
    run_with_user_config(live, cluster, {"alloc_mb": 0, "max_tokens_cap": 128})
    token_calibration(incident.deployment)
    r3 = by_remedy(wizards.start(actor(people), incident=incident)[0])["R3"]
    assert r3.kind == "checklist" and r3.patch is None and "413" in r3.values["guidance"]
    assert "no usable max_prompt_tokens" in r3.values["warnings"][0]


def test_caps_the_deployment_reads_but_leaves_null_are_offered(people, incident, live, cluster):
    run_with_user_config(live, cluster, {"alloc_mb": 0, "max_prompt_tokens": None, "max_tokens_cap": None})
    token_calibration(incident.deployment)
    wizard, _ = wizards.start(actor(people), incident=incident)
    r3 = by_remedy(wizard)["R3"]
    assert r3.kind == "config" and r3.status == "pending"
    caps = r3.patch["user_config"]
    plan, budget = wizard.diagnosis["plan"], wizard.diagnosis["budget"]["bytes_per_node"]
    fit = (budget // plan["per_node"] - wizard.diagnosis["memory"]["baseline_bytes"]) // (plan["concurrency"] * MIB)
    # Both set so that one request fits, three quarters of it prompt.
    assert caps["max_prompt_tokens"] == int(fit * 0.75) and caps["max_prompt_tokens"] + caps["max_tokens_cap"] == fit
    assert "null today" in r3.values["reasons"]["max_prompt_tokens"]
