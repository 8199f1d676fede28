"""Sizing from a calibrated mix of requests: the peak of c requests drawn from it at the sizing
quantile, the input caps from where its tail breaks the budget, the margin from its noisiest request."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from django.urls import reverse

from apps.accounts.audit import Actor
from apps.calibration.curve import Curve, MixEntry
from apps.calibration.models import MemoryCalibration
from apps.remediation import margin, measurements, plan_choice, schedulable, sizing, token_caps, wizards
from apps.remediation.models import Wizard

MIB, GIB = 2**20, 2**30
LEVELS = (1, 2, 4, 8)


def entry(label: str, share: float, increment_mib: int, tokens: int | None = None, samples=None) -> MixEntry:
    return MixEntry(
        label=label,
        share=share,
        increment_bytes=increment_mib * MIB,
        points=tuple((float(c), (100 + c * increment_mib) * MIB) for c in LEVELS),
        service_s={float(c): 1.0 for c in LEVELS},
        peak_samples=samples or {},
        tokens=tokens,
    )


def mixed(*entries: MixEntry) -> Curve:
    typical = max(entries, key=lambda e: e.share)
    return Curve(
        axis="concurrency",
        device="cpu",
        baseline_bytes=100 * MIB,
        points=list(typical.points),
        measured_at=datetime(2026, 12, 1, tzinfo=UTC),
        calibration_id=12,
        service_s=dict(typical.service_s),
        mix=entries,
    )


def single(increment_mib: int) -> Curve:
    return Curve(
        axis="concurrency",
        device="cpu",
        baseline_bytes=100 * MIB,
        points=[(float(c), (100 + c * increment_mib) * MIB) for c in LEVELS],
        measured_at=datetime(2026, 12, 1, tzinfo=UTC),
        calibration_id=11,
        service_s={float(c): 1.0 for c in LEVELS},
    )


HEAVY_TAIL = (entry("GET /small", 80, 100, tokens=500), entry("GET /large", 20, 500, tokens=2000))
# One replica's worth of CPU, so throughput is c / service time and the largest c that fits wins.
ONE_REPLICA = schedulable.resources_from({"ray_actor_options": {"num_cpus": 1}}, [{"CPU": 1, "memory": 24 * GIB}], [])


def current(**overrides) -> sizing.Current:
    return sizing.Current(8, -1, None, None, "2.60.0", **overrides)


def size(curve: Curve, budget_mib: int = 1000, **overrides) -> sizing.Sizing:
    return sizing.compute(
        current(**overrides),
        measurements.memory_from_curve(curve),
        measurements.Budget(budget_mib * MIB, 1, "budget"),
        measurements.Load(),
        latency_objective_ms=10_000,
        curve=curve,
        resources=ONE_REPLICA,
    )


def test_a_heavy_tail_sizes_a_lower_concurrency_than_its_mean_would():
    # The mean request of 80 % x 100 MiB + 20 % x 500 MiB is 180 MiB: four of them peak at 820 MiB and fit 1,000.
    by_mean = size(single(180))
    assert by_mean.patch("R1")["max_ongoing_requests"] == 4
    # Drawn from the mix, two requests are both large 4 % of the time: 100 + 2 x 500 = 1,100 MiB does not fit,
    # so one request at a time (600 MiB at worst) is what the budget holds.
    by_mix = size(mixed(*HEAVY_TAIL))
    assert by_mix.patch("R1")["max_ongoing_requests"] == 1
    reason = by_mix.values["R1"]["reasons"]["max_ongoing_requests"]
    assert "peaks at about 600 MiB" in reason and "measured a mix of 2 requests" in reason
    assert "99.99th percentile" in reason and "GET /large 20 % of traffic, +500 MiB each" in reason


def test_a_rare_heavy_request_costs_concurrency_only_where_its_combinations_are_likely():
    # 1 % large: at 4 in flight, two large together is 6 in 10,000, inside the quantile; three is 4 in a million.
    rare = mixed(entry("GET /small", 99, 100), entry("GET /large", 1, 500))
    memory = measurements.memory_from_curve(rare)
    assert memory.peak(4) == (100 + 2 * 500 + 2 * 100) * MIB
    assert memory.per_request_bytes == 104 * MIB  # the mean, what traffic's per-request figure compares to
    assert size(rare, budget_mib=1400).patch("R1")["max_ongoing_requests"] == 4


def test_the_input_caps_come_from_where_the_mix_s_tail_breaks_the_budget():
    config = {"max_prompt_tokens": 3000, "max_tokens_cap": 1000}
    caps = size(mixed(*HEAVY_TAIL), user_config=config).values["R3"]
    # One request at a time: the heavy request may grow to the 900 MiB above rest; at 256 KiB per token (the large
    # request's 500 MiB for 2,000 tokens, costlier than the small one's 100 MiB for 500) that is 3,600 tokens,
    # split as the caps are.
    assert caps["value"] == {"max_prompt_tokens": 2700, "max_tokens_cap": 900}
    reason = caps["reasons"]["max_prompt_tokens"]
    assert "heaviest request (GET /large, 20 % of traffic, +500 MiB measured) adds at most 900 MiB" in reason
    assert "256 KiB per token" in reason
    assert any("beyond the largest request of the mix (2000 tokens)" in w for w in caps["warnings"])


def test_without_the_tokens_of_its_requests_a_mix_gives_the_room_but_no_cap():
    untokened = mixed(entry("GET /small", 80, 100), entry("GET /large", 20, 500))
    memory = measurements.memory_from_curve(untokened)
    budget = measurements.Budget(1000 * MIB, 1, "budget")
    plan = plan_choice.choose(memory, budget, ONE_REPLICA, 10_000)
    caps = token_caps.input_caps(
        {"max_prompt_tokens": 3000, "max_tokens_cap": 1000}, memory, budget, plan, untokened, None
    )
    assert caps["waiting"] and caps["patch"] is None
    assert (
        "adds at most 900 MiB" in caps["why_waiting"]
        and "Give each request of the mix its tokens" in caps["why_waiting"]
    )


def test_the_noisiest_request_of_the_mix_sets_the_margin():
    steady = {1.0: [200 * MIB, 199 * MIB, 198 * MIB]}
    noisy = {1.0: [600 * MIB, 500 * MIB, 560 * MIB]}
    curve = mixed(entry("GET /small", 80, 100, samples=steady), entry("GET /large", 20, 500, samples=noisy))
    found = margin.from_curve(curve)
    # 100 / 600 = 16.7 % spread on the large request: twice that is kept free.
    assert abs(found.fraction - 2 * 100 / 600) < 1e-9
    assert "16.7% spread of the peaks at 1 of GET /large" in found.reason


@pytest.mark.django_db
def test_the_wizard_s_calibration_step_takes_a_mix_and_refuses_a_bad_one_naming_the_field(api_as, incident, use_replay):
    operator = api_as("operator")
    wizard = operator.post("/api/v1/wizards/", {"incident": incident.pk}, format="json").json()
    use_replay.routes["/api/cluster_status"] = "cluster_status.json"
    use_replay.routes["/api/jobs/"] = "jobs_submit_response.json"
    handle = [{"request": {"kind": "handle", "args": ["short"]}, "share": 80}]
    refused = operator.post(
        f"/api/v1/wizards/{wizard['id']}/calibrate/",
        {
            "revision": wizard["revision"],
            "mix": [*handle, {"request": {"kind": "handle", "args": ["long"]}, "share": 30}],
        },
        format="json",
    )
    assert refused.status_code == 400 and "the shares add up to 110" in refused.json()["mix"][0]
    assert not MemoryCalibration.objects.exists()
    started = operator.post(
        f"/api/v1/wizards/{wizard['id']}/calibrate/",
        {
            "revision": wizard["revision"],
            "mix": [*handle, {"request": {"kind": "handle", "args": ["long"]}, "share": 20}],
        },
        format="json",
    )
    assert started.status_code == 202, started.content
    run = MemoryCalibration.objects.get(pk=started.json()["steps"][1]["calibration"])
    assert [e["share"] for e in run.mix] == [80.0, 20.0] and run.levels == [1, 2, 4, 8]


@pytest.mark.django_db
def test_the_wizard_page_takes_a_mix_and_shows_why_one_is_refused(client, people, incident, use_replay):
    wizard, _ = wizards.start(Actor(user=people["operator"], via="test"), incident=incident)
    use_replay.routes["/api/cluster_status"] = "cluster_status.json"
    use_replay.routes["/api/jobs/"] = "jobs_submit_response.json"
    client.force_login(people["operator"])

    def post(mix: str):
        return client.post(
            reverse("remediation:wizard_action", args=[wizard.pk, "calibrate"]),
            {"revision": Wizard.objects.get().revision, "step": 1, "mix": mix},
            HTTP_HX_REQUEST="true",
        ).content.decode()

    assert "mix: not JSON" in post("[{")
    assert "mix[0].share: a share is above 0" in post('[{"request": {"kind": "handle", "args": []}, "share": -5}]')
    assert not MemoryCalibration.objects.exists()
    post(json.dumps([{"request": {"kind": "handle", "args": [name]}, "share": 50} for name in "ab"]))
    assert [e["request"]["args"] for e in MemoryCalibration.objects.get().mix] == [["a"], ["b"]]
