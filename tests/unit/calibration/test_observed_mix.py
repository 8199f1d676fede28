"""A calibration mix taken from the traffic's observed sizes: the operator's template filled in at
each size class, weighted as the traffic was, refused with the reason when there is nothing to take
it from, and expanded by the job without carrying the filler in its command line."""

from __future__ import annotations

import json
import shlex
import time

import pytest
from django.core.exceptions import ValidationError

from apps.accounts.audit import Actor
from apps.calibration import job_script
from apps.calibration.models import MemoryCalibration
from apps.calibration.observed_mix import observed_mix, sized
from apps.fleet import request_sizes
from apps.incidents.models import SignalWindow
from apps.incidents.request_sizes import observed
from tests.unit.calibration.test_calibration_mix import echo_of, submitted_jobs

TEMPLATE = {"kind": "http", "method": "POST", "path": "/demo/generate", "json": {"prompt": "{pad}", "n": "{size}"}}


def sizes(unit: str = "bytes", buckets=None) -> dict:
    buckets = buckets or [("256", 60.0), ("4096", 30.0), ("16384", 10.0), ("+Inf", 0.0)]
    return {
        "source": {"metric": "ray_demo_request_bytes", "unit": unit, "output": None},
        "hours": 24,
        "input": {
            "buckets": [{"le": le, "requests": n} for le, n in buckets],
            "quantiles": {"requests": round(sum(n for _, n in buckets))},
        },
        "output": None,
    }


def test_each_size_class_is_the_template_at_its_bound_weighted_as_the_traffic_was():
    mix, origin = observed_mix(TEMPLATE, sizes(), levels=2)
    assert [(e["share"], e["request"]["json"]) for e in mix] == [
        (60.0, {"prompt": "{pad:256}", "n": 256}),
        (30.0, {"prompt": "{pad:4096}", "n": 4096}),
        (10.0, {"prompt": "{pad:16384}", "n": 16384}),
    ]
    assert "tokens" not in mix[0]
    assert origin == {
        "source": "ray_demo_request_bytes",
        "unit": "bytes",
        "hours": 24,
        "requests": 100,
        "above_last_bound": 0.0,
    }
    # In tokens: a filler of words, and each entry prices its tokens for the input caps.
    tokens, _ = observed_mix(TEMPLATE, sizes("tokens"), levels=2)
    assert tokens[2]["request"]["json"]["prompt"] == "{words:16384}" and tokens[2]["tokens"] == 16384
    # Many levels leave room for fewer requests: the job's bound on levels to run holds.
    assert len(observed_mix(TEMPLATE, sizes(), levels=8)[0]) == 3
    assert len(observed_mix(TEMPLATE, sizes(), levels=12)[0]) == 2


def test_the_size_goes_where_the_template_says():
    query = {"kind": "http", "method": "GET", "path": "/demo", "query": "kb={size}&p={pad}"}
    assert sized(query, 1024.0, "bytes")["query"] == "kb=1024&p={pad:1024}"
    handle = {"kind": "handle", "args": ["{size}", {"text": "{pad}"}]}
    assert sized(handle, 8, "tokens")["args"] == [8, {"text": "{words:8}"}]


def test_requests_above_the_last_bound_are_measured_at_it_and_said():
    mix, origin = observed_mix(TEMPLATE, sizes(buckets=[("1024", 95.0), ("+Inf", 5.0)]), levels=2)
    assert [(e["share"], e["request"]["json"]["n"]) for e in mix] == [(95.0, 1024), (5.0, 1024)]
    assert origin["above_last_bound"] == 5.0


@pytest.mark.parametrize(
    "template, given, field, fragment",
    [
        (None, sizes(), "request", "give the request, with {size} or {pad}"),
        ({"kind": "http", "method": "GET", "path": "/demo"}, sizes(), "request", "every size class would send"),
        (TEMPLATE, {"source": None, "hours": 24, "input": None}, "mix", "nothing counts them for this deployment"),
        (TEMPLATE, {**sizes(), "input": None}, "mix", "no request of this deployment was counted"),
        (TEMPLATE, sizes(buckets=[("+Inf", 4.0)]), "mix", "only above its last bound"),
    ],
)
def test_nothing_to_take_a_mix_from_is_refused_with_the_reason(template, given, field, fragment):
    with pytest.raises(ValidationError) as caught:
        observed_mix(template, given, levels=2)
    assert fragment in caught.value.message_dict[field][0]


def test_the_job_expands_the_filler_and_labels_each_request_by_it():
    assert job_script.padded('{"prompt": "{pad:5}", "q": "{words:3}"}') == '{"prompt": "xxxxx", "q": "word word word"}'
    request = {"kind": "http", "method": "POST", "path": "/g", "json": {"prompt": "{words:4096}"}}
    assert job_script.describe(request) == "POST /g with 4,096 words of filler"
    http = job_script.HttpRequest({**request, "query": "n={pad:2}"}, "/")
    scope, _ = http.call(1)
    assert scope["query_string"] == b"n=xx" and len(json.loads(http.body)["prompt"].split()) == 4096


@pytest.mark.django_db
def test_the_api_calibrates_from_the_observed_traffic(api_as, model, people, use_replay):
    echo = echo_of(model)
    request_sizes.set_size_metric(
        Actor(user=people["operator"], via="test"), echo, metric="ray_demo_request_bytes", unit="bytes"
    )
    body = {"deployment": echo.pk, "mix": "observed", "request": TEMPLATE, "levels": [1, 2]}
    refused = api_as("operator").post("/api/v1/calibrations/", body, format="json")
    assert refused.status_code == 400 and "no request of this deployment was counted" in json.dumps(refused.json())
    assert not MemoryCalibration.objects.exists()

    SignalWindow.objects.create(
        cluster=echo.application.cluster,
        application_name=echo.application.name,
        deployment_name=echo.name,
        points=[{"t": time.time() - 60, "seconds": 30, "size_in": {"256": 8.0, "4096": 2.0}}],
    )
    assert observed(echo)["input"]["quantiles"]["requests"] == 10
    response = api_as("operator").post("/api/v1/calibrations/", body, format="json")
    assert response.status_code == 202, response.content
    calibration = MemoryCalibration.objects.get()
    assert [(e["share"], e["request"]["json"]["prompt"]) for e in calibration.mix] == [
        (80.0, "{pad:256}"),
        (20.0, "{pad:4096}"),
    ]
    assert calibration.request["mix_from"]["requests"] == 10
    argv = shlex.split(submitted_jobs(use_replay)[-1]["entrypoint"])
    sent = job_script.parse_mix(argv[argv.index("--mix") + 1])
    # The filler travels as its mark: the command line stays small whatever the sizes.
    assert [e["request"]["json"]["prompt"] for e in sent] == ["{pad:256}", "{pad:4096}"]
