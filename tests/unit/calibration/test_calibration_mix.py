"""A calibration of a weighted mix of requests: refused before anything is saved when its shares or
entries are wrong, sent to the job with each request's headers apart, read back request by request,
and shown with the peak sizing reads."""

from __future__ import annotations

import json
import re
import shlex

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from apps.calibration import job_script, services
from apps.calibration.models import MemoryCalibration
from apps.core.redaction import placeholder
from apps.core.secrets import decrypt
from apps.fleet.models import Deployment
from tests.unit.calibration.helpers import MIB, job_says, result_line


def echo_of(model) -> Deployment:
    return Deployment.objects.select_related("application__cluster__team").get(
        application=model.application, name="Echo"
    )


def http(query: str, **extra) -> dict:
    return {"kind": "http", "method": "GET", "path": "/demo/generate", "query": query, **extra}


SMALL_LARGE = [{"request": http("size=small"), "share": 80}, {"request": http("size=large"), "share": 20}]


def submitted_jobs(replay) -> list[dict]:
    return [json.loads(r.content) for r in replay.requests if r.method == "POST" and r.url.path == "/api/jobs/"]


def argv_of(job: dict) -> list[str]:
    return shlex.split(job["entrypoint"])


@pytest.mark.parametrize(
    "mix, field, fragment",
    [
        (
            [{"request": http("a"), "share": 70}, {"request": http("b"), "share": 20}],
            "mix",
            "the shares add up to 90, not 100 (±0.5)",
        ),
        ("everything", "mix", "give a list of 1 to 8 entries"),
        ([{"request": http("a"), "share": 50}, {"request": http("b"), "share": "half"}], "mix[1].share", "not 'half'"),
        ([{"request": http("a"), "share": 100}, {"request": http("b"), "share": 0}], "mix[1].share", "above 0"),
        ([{"request": {"kind": "grpc"}, "share": 100}], "mix[0].request", 'kind must be "http" or "handle"'),
        ([{"request": http("a"), "share": 100, "weight": 2}], "mix[0]", "has no weight"),
        ([{"request": http("a"), "share": 100, "tokens": 0}], "mix[0].tokens", "at least 1"),
        (
            [{"request": http("a"), "share": 50}, {"request": {"kind": "handle", "args": []}, "share": 50}],
            "mix",
            "all HTTP requests or all handle calls",
        ),
        ([{"request": http(str(i)), "share": 100 / 9} for i in range(9)], "mix", "at most 8 are measured"),
    ],
)
def test_a_bad_mix_is_a_400_naming_the_field_and_nothing_is_saved_or_sent(
    api_as, model, use_replay, mix, field, fragment
):
    response = api_as("operator").post(
        "/api/v1/calibrations/", {"deployment": echo_of(model).pk, "mix": mix}, format="json"
    )
    assert response.status_code == 400, response.content
    body = response.json()
    assert list(body) == [field] and fragment in body[field][0] and body[field][0].startswith(f"{field}: ")
    assert not MemoryCalibration.objects.exists() and not submitted_jobs(use_replay)


def test_shares_off_by_rounding_are_accepted_but_too_many_levels_per_request_are_not(model, operator):
    thirds = [{"request": http(str(i)), "share": 33.3} for i in range(3)]
    assert services.request_calibration(operator, echo_of(model), mix=thirds).mix[2]["share"] == 33.3
    MemoryCalibration.objects.all().delete()
    eight = [{"request": http(str(i)), "share": 12.5} for i in range(8)]
    with pytest.raises(ValidationError, match=re.escape("8 requests at 4 levels each is 32 levels to run")):
        services.request_calibration(operator, echo_of(model), mix=eight, levels=[1, 2, 4, 8])
    assert not MemoryCalibration.objects.exists()


def test_a_mix_with_a_request_or_on_the_token_axis_is_refused(model, operator):
    with pytest.raises(ValidationError, match="give only one of them"):
        services.request_calibration(operator, echo_of(model), mix=SMALL_LARGE, request=http("x"))
    with pytest.raises(ValidationError, match="give only one of them"):
        services.request_calibration(operator, echo_of(model), mix=SMALL_LARGE, axis="token_sum")


def test_a_mix_is_stored_and_sent_with_each_request_s_headers_in_the_job_environment(
    api_as, model, use_replay, monkeypatch
):
    secret = {"Authorization": "Bearer live_mix_1"}
    mix = [
        {"request": http("size=small", headers=secret), "share": 75, "tokens": 300},
        {"request": http("size=large"), "share": 25, "tokens": 3000},
    ]
    response = api_as("operator").post(
        "/api/v1/calibrations/", {"deployment": echo_of(model).pk, "mix": mix}, format="json"
    )
    assert response.status_code == 202, response.content
    body = response.json()
    assert [e["share"] for e in body["mix"]] == [75, 25] and [e["tokens"] for e in body["mix"]] == [300, 3000]
    assert body["mix"][0]["request"]["headers"] == {"Authorization": placeholder("Bearer live_mix_1")}
    assert body["mix_peaks"] == []
    # The largest share stands for the curve.
    assert body["request"]["representative"]["query"] == "size=small"
    calibration = MemoryCalibration.objects.get()
    assert json.loads(decrypt(calibration.headers_ciphertext)) == [secret, {}]

    job = submitted_jobs(use_replay)[-1]
    argv = argv_of(job)
    assert "--request" not in argv and "live_mix_1" not in job["entrypoint"]
    for name, value in job["runtime_env"]["env_vars"].items():
        monkeypatch.setenv(name, value)
    received = job_script.parse_mix(argv[argv.index("--mix") + 1])
    assert [e["share"] for e in received] == [75, 25]
    assert received[0]["request"]["headers"] == secret and received[1]["request"]["query"] == "size=large"


def test_a_mix_of_one_request_is_calibrated_exactly_as_that_request(model, operator, use_replay):
    calibration = services.request_calibration(
        operator, echo_of(model), mix=[{"request": http("size=small"), "share": 100}]
    )
    argv = argv_of(submitted_jobs(use_replay)[-1])
    assert calibration.mix == [] and "--mix" not in argv
    assert json.loads(argv[argv.index("--request") + 1])["query"] == "size=small"


def test_the_warmup_profiles_make_a_preset_mix_weighted_by_the_requests_each_sends(model, operator, use_replay):
    from apps.maintenance.models import WarmupProfile

    WarmupProfile.objects.create(application=model.application, name="a-chat", path="/demo/chat?n=1", requests=20)
    WarmupProfile.objects.create(
        application=model.application, name="b-long", method="post", path="/demo/long", body={"p": 1}, requests=5
    )
    calibration = services.request_calibration(operator, echo_of(model), mix="warmup")
    assert [(e["request"]["path"], e["request"]["query"], e["share"]) for e in calibration.mix] == [
        ("/demo/chat", "n=1", 80.0),
        ("/demo/long", "", 20.0),
    ]
    assert calibration.mix[1]["request"]["json"] == {"p": 1}
    MemoryCalibration.objects.all().delete()
    # Model is not the ingress the profiles call.
    with pytest.raises(ValidationError, match="is not it: give the mix"):
        services.request_calibration(operator, model, mix="warmup")


def test_without_warmup_profiles_the_preset_is_refused_naming_the_field(api_as, model, use_replay):
    response = api_as("operator").post(
        "/api/v1/calibrations/", {"deployment": echo_of(model).pk, "mix": "warmup"}, format="json"
    )
    assert response.status_code == 400 and "it has none: give the mix" in response.json()["detail"][0]
    assert not MemoryCalibration.objects.exists()


MIXED_RESULT = {
    "shape": "starlette",
    "points": [
        {"concurrency": 1, "peak_bytes": 200 * MIB, "peak_samples": [200 * MIB, 198 * MIB], "service_s": 0.2},
        {"concurrency": 2, "peak_bytes": 300 * MIB, "peak_samples": [300 * MIB, 296 * MIB], "service_s": 0.2},
    ],
    "mix": [
        {
            "label": "GET /demo/generate?size=small",
            "share": 80,
            "limit_reason": None,
            "points": [
                {"concurrency": 1, "peak_bytes": 200 * MIB, "peak_samples": [200 * MIB, 198 * MIB], "service_s": 0.2},
                {"concurrency": 2, "peak_bytes": 300 * MIB, "peak_samples": [300 * MIB, 296 * MIB], "service_s": 0.2},
            ],
        },
        {
            "label": "GET /demo/generate?size=large",
            "share": 20,
            "limit_reason": "concurrency 2 of mix[1] would exceed the memory budget",
            "points": [
                {"concurrency": 1, "peak_bytes": 600 * MIB, "peak_samples": [600 * MIB, 580 * MIB], "service_s": 0.6}
            ],
        },
    ],
}


def finished(model, operator, use_replay, result=None) -> MemoryCalibration:
    calibration = services.request_calibration(operator, echo_of(model), mix=SMALL_LARGE, levels=[1, 2])
    job_says(use_replay, calibration, "SUCCEEDED", logs=result_line(**(result or MIXED_RESULT)))
    return services.poll(calibration.pk)


def test_each_request_s_increment_is_read_back_and_sizing_reads_the_quantile_of_the_mix(
    model, operator, use_replay, api_as
):
    calibration = finished(model, operator, use_replay)
    assert calibration.state == "succeeded", calibration.error
    # Over the 100 MiB at rest: the small request's steepest step is 100 MiB, the large one's 500 MiB.
    assert [(e["label"], e["increment_bytes"]) for e in calibration.mix] == [
        ("GET /demo/generate?size=small", 100 * MIB),
        ("GET /demo/generate?size=large", 500 * MIB),
    ]
    assert calibration.mix[1]["limit_reason"].startswith("concurrency 2 of mix[1]")
    curve = services.curve_of(calibration)
    assert curve.is_mixed and [e.share for e in curve.mix] == [80.0, 20.0]
    # Two requests from 80/20: both large is 4 %, well above 1 in 10,000, so the peak is rest + 2 x 500 MiB.
    assert curve.mix_peak(2) == 100 * MIB + 1000 * MIB
    # A request of the mix takes 0.8 x 0.2 + 0.2 x 0.6 = 0.28 s at level 1; only the small one measured 2.
    assert curve.service_s == {1.0: pytest.approx(0.28), 2.0: pytest.approx(0.2)}
    body = api_as("viewer").get(f"/api/v1/calibrations/{calibration.pk}/").json()
    assert body["mix_peaks"] == [
        {"concurrency": 1, "peak_bytes": 600 * MIB},
        {"concurrency": 2, "peak_bytes": 1100 * MIB},
    ]
    assert body["mix"][1]["increment_bytes"] == 500 * MIB and body["mix"][1]["points"][0]["x"] == 1


def test_a_result_that_does_not_measure_every_request_of_the_mix_fails(model, operator, use_replay):
    single = {k: v for k, v in MIXED_RESULT.items() if k != "mix"}
    calibration = finished(model, operator, use_replay, single)
    assert calibration.state == "failed"
    assert calibration.error == "The job measured one request, but a mix of 2 was asked."


def test_a_request_of_the_mix_that_fails_or_alone_exceeds_the_budget_is_named(model, operator, use_replay):
    calibration = services.request_calibration(operator, echo_of(model), mix=SMALL_LARGE)
    said = (
        "Node memory reached 1900 MiB during concurrency 1 of mix[1] (GET /demo/generate?size=large), past the stop "
        "at 1500 MiB; the run ended there. mix[1] (GET /demo/generate?size=large) alone exceeds the memory budget, so "
        "the mix is not calibrated; nothing was pushed."
    )
    job_says(use_replay, calibration, "FAILED", logs=f"FLEETDECK_CALIBRATION_ERROR {said}\n", message="exit 1")
    calibration = services.poll(calibration.pk)
    assert calibration.state == "failed" and calibration.error.startswith(said)
    assert services.latest_curve(echo_of(model)) is None


def test_the_card_takes_a_mix_and_shows_each_request_and_the_peak_sizing_reads(login, model, operator, use_replay):
    echo = echo_of(model)
    client = login("operator")
    refused = client.post(
        reverse("calibration:calibrate", args=[echo.pk]),
        {"levels": "1,2", "mix": json.dumps([{"request": http("a"), "share": 60}])},
        HTTP_HX_REQUEST="true",
    ).content.decode()
    assert "mix: the shares add up to 60, not 100" in refused and not MemoryCalibration.objects.exists()

    client.post(
        reverse("calibration:calibrate", args=[echo.pk]),
        {"levels": "1,2", "mix": json.dumps(SMALL_LARGE)},
        HTTP_HX_REQUEST="true",
    )
    calibration = MemoryCalibration.objects.get()
    assert len(calibration.mix) == 2
    job_says(use_replay, calibration, "SUCCEEDED", logs=result_line(**MIXED_RESULT))
    services.poll(calibration.pk)
    card = client.get(reverse("calibration:card", args=[echo.pk]), HTTP_HX_REQUEST="true").content.decode()
    assert "Mix of requests" in card and "GET /demo/generate?size=large" in card and "+500\xa0MiB" in card
    assert "99.99th percentile" in card and "1.1\xa0GiB at 2" in card


def test_with_warmups_of_different_requests_an_empty_calibration_measures_their_mix(model, operator, use_replay):
    from apps.maintenance.models import WarmupProfile

    WarmupProfile.objects.create(application=model.application, name="a-chat", path="/demo/chat?n=1", requests=20)
    one = services.request_calibration(operator, echo_of(model))
    assert one.mix == [] and one.request["representative"]["path"] == "/demo/chat"  # one kind: that request
    MemoryCalibration.objects.all().delete()
    WarmupProfile.objects.create(
        application=model.application, name="b-long", method="post", path="/demo/long", body={"p": 1}, requests=5
    )
    both = services.request_calibration(operator, echo_of(model))
    # Sized from the chat request alone, the deployment would be unsafe for the long one.
    assert [(e["request"]["path"], e["share"]) for e in both.mix] == [("/demo/chat", 80.0), ("/demo/long", 20.0)]
    assert "--mix" in argv_of(submitted_jobs(use_replay)[-1])
