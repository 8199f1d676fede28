"""The calibration scripts as plain processes: deploy/reference_app/calibrate.py, whose last line
is a curve the control plane's parser accepts, and Fleetdeck's own job script driving classes
written as in Ray's docs (Starlette, FastAPI, handle) through their own interface, within a
memory budget."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from apps.calibration.curve import parse_output
from apps.demo.local_ray import REFERENCE_APP_DIR

# Each test runs a calibration script as its own process, the reference model included: `make test`
# runs them, `make check` does not.
pytestmark = pytest.mark.slow


def generator_user_config() -> dict:
    config = json.loads((REFERENCE_APP_DIR / "reference.json").read_text())
    return next(d for d in config["applications"][0]["deployments"] if d["name"] == "Generator")["user_config"]


def calibrate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REFERENCE_APP_DIR / "calibrate.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_calibration_curve_parses_and_grows_with_the_token_sum():
    token_sums = [64, 256, 1024]
    result = calibrate("--token-sums", *map(str, token_sums), "--repeats", "1", "--device", "cpu")
    assert result.returncode == 0, result.stderr

    curve = parse_output(result.stdout)
    assert (curve["axis"], curve["device"]) == ("token_sum", "cpu") and curve["baseline_bytes"] > 0
    assert [point["x"] for point in curve["points"]] == token_sums
    peaks = [point["peak_bytes"] for point in curve["points"]]
    print(f"\nbaseline {curve['baseline_bytes']} bytes, peaks {dict(zip(token_sums, peaks, strict=True))}")
    assert curve["monotone"] and curve["baseline_bytes"] <= peaks[0] < peaks[-1]
    # The default config's per-token temporaries alone account for this much of the rise.
    scratch_kb = generator_user_config()["scratch_kb_per_token"]
    assert peaks[-1] - peaks[0] >= (token_sums[-1] - token_sums[0]) * scratch_kb * 1024


def test_a_failed_calibration_says_why_on_its_last_line(tmp_path):
    config = tmp_path / "serve.json"
    config.write_text(json.dumps({"applications": [{"name": "other", "deployments": [{"name": "Model"}]}]}))

    result = calibrate("--token-sums", "64", "--config", str(config))

    assert result.returncode == 1
    assert result.stdout.strip().splitlines()[-1] == (
        f"FLEETDECK_CALIBRATION_ERROR CalibrationFailed: {config} has no Generator deployment"
    )


# --- apps/calibration/job_script.py on classes written as in Ray's docs ------------------------

SHAPES_APP = '''
import asyncio, os
from fastapi import FastAPI
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse

MIB = 1 << 20


def fill(mb):
    return bytearray(b"\\x01") * int(mb * MIB)


@serve.deployment
class Plain:
    def __init__(self):
        self.model = fill(8)

    async def __call__(self, request: Request):
        if "missing" in request.query_params:
            return PlainTextResponse("no such thing", status_code=404)
        body = await request.json()
        scratch = fill(float(request.query_params["mb"]) + body["extra_mb"])
        await asyncio.sleep(0.2)
        return JSONResponse({"n": len(scratch), "path": request.url.path})


api = FastAPI()


@serve.deployment
@serve.ingress(api)
class API:
    def __init__(self):
        self.model = fill(8)

    @api.post("/generate")
    async def generate(self, body: dict) -> dict:
        scratch = fill(body["mb"])
        await asyncio.sleep(0.2)
        return {"n": len(scratch)}


class Handle:
    async def __call__(self, text, mb):
        scratch = fill(mb)
        await asyncio.sleep(0.2)
        return len(text) + len(scratch)


class Growing:
    """Small for its first four calls (the warm one and level 1's three rounds), then huge: only
    the sampler watching the node mid-level can stop it."""

    def __init__(self):
        self.calls = 0

    async def __call__(self):
        self.calls += 1
        scratch = fill(4 if self.calls <= 4 else int(os.environ["GROWING_MB"]))
        await asyncio.sleep(1.0)
        return len(scratch)


class Cached:
    """Answers a prompt it has seen from its cache, as the reference app does."""

    def __init__(self):
        self.seen = set()

    async def __call__(self, request: Request):
        prompt = (await request.json())["prompt"]
        if prompt in self.seen:
            return {"cached": True}
        self.seen.add(prompt)
        scratch = fill(16)
        await asyncio.sleep(0.2)
        return {"n": len(scratch)}


class Exploding:
    def __init__(self):
        raise RuntimeError("weights not found")
'''

MIB = 2**20


@pytest.fixture
def shapes_app(tmp_path):
    (tmp_path / "shapes_app.py").write_text(SHAPES_APP)
    return tmp_path


def run_script(app_dir, *args: str, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    from apps.calibration import job_script

    return subprocess.run(
        [sys.executable, job_script.__file__, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=app_dir,
        env={"PYTHONPATH": str(app_dir), "PATH": "/usr/bin:/bin", **(env or {})},
    )


def result_of(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stdout + done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("FLEETDECK_CALIBRATION {"), done.stdout
    return json.loads(last.removeprefix("FLEETDECK_CALIBRATION "))


def error_of(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 1, done.stdout + done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("FLEETDECK_CALIBRATION_ERROR "), done.stdout
    return last.removeprefix("FLEETDECK_CALIBRATION_ERROR ")


def per_request_mib(result: dict) -> list[float]:
    """What each level holds above the warm rest, per request in flight."""
    return [(p["peak_bytes"] - result["baseline_bytes"]) / p["concurrency"] / MIB for p in result["points"]]


def test_a_starlette_request_handler_gets_a_real_request_with_query_and_json_body(shapes_app):
    request = {"kind": "http", "method": "POST", "path": "/plain", "query": "mb=16", "json": {"extra_mb": 8}}
    result = result_of(
        run_script(
            shapes_app, "--import-path", "shapes_app:Plain", "--request", json.dumps(request), "--levels", "1,2,4"
        )
    )
    parsed = parse_output("FLEETDECK_CALIBRATION " + json.dumps(result))
    assert result["shape"] == "starlette" and result["limit_reason"] is None and parsed["monotone"]
    # 16 MiB from the query string and 8 from the JSON body, per request, at every level: each
    # level's peak is its own, not the highest so far.
    assert all(22 <= mib <= 30 for mib in per_request_mib(result)), per_request_mib(result)
    assert result["cold_baseline_bytes"] >= 8 * MIB and result["baseline_bytes"] >= result["cold_baseline_bytes"] * 0.9
    assert all(0.2 <= p["service_s"] < 1.0 for p in result["points"])
    assert all(p["uss_peak_bytes"] and p["uss_peak_bytes"] <= p["peak_bytes"] for p in result["points"])
    # Each level ran three rounds: their peaks (the point's peak is the largest) and what stayed at rest after.
    for point in result["points"]:
        assert len(point["peak_samples"]) == 3 and point["peak_bytes"] == max(point["peak_samples"])
        assert point["rest_after_bytes"] >= 8 * MIB
    assert all("peak_samples" in p for p in parsed["points"])


def test_a_call_number_in_the_request_gets_past_an_answer_cache(shapes_app):
    def measure(prompt: str) -> list[float]:
        request = {"kind": "http", "method": "POST", "path": "/cached", "json": {"prompt": prompt}}
        return per_request_mib(
            result_of(
                run_script(
                    shapes_app,
                    "--import-path",
                    "shapes_app:Cached",
                    "--request",
                    json.dumps(request),
                    "--levels",
                    "1,2",
                )
            )
        )

    # The same prompt every time: after the warm call the cache answers and nothing is measured.
    assert all(mib < 4 for mib in measure("hello")), measure("hello")
    assert all(14 <= mib <= 22 for mib in measure("hello {n}"))


def test_a_fastapi_ingress_is_driven_as_an_asgi_app_under_its_route_prefix(shapes_app):
    request = {"kind": "http", "method": "POST", "path": "/api/generate", "json": {"mb": 16}}
    result = result_of(
        run_script(
            shapes_app,
            "--import-path",
            "shapes_app:API",
            "--request",
            json.dumps(request),
            "--route-prefix",
            "/api",
            "--levels",
            "1,2",
        )
    )
    assert result["shape"] == "asgi"
    assert all(14 <= mib <= 22 for mib in per_request_mib(result)), per_request_mib(result)


def test_a_handle_called_class_gets_its_json_arguments(shapes_app):
    result = result_of(
        run_script(
            shapes_app,
            "--import-path",
            "shapes_app:Handle",
            "--request",
            json.dumps({"kind": "handle", "args": ["hello", 16]}),
            "--levels",
            "1,4",
        )
    )
    assert result["shape"] == "handle" and [p["concurrency"] for p in result["points"]] == [1, 4]
    assert all(14 <= mib <= 22 for mib in per_request_mib(result)), per_request_mib(result)


def test_a_representative_request_that_answers_404_fails_the_calibration_and_says_so(shapes_app):
    request = {"kind": "http", "path": "/plain", "query": "missing=1&x=1"}
    message = error_of(run_script(shapes_app, "--import-path", "shapes_app:Plain", "--request", json.dumps(request)))
    assert message == (
        "The representative request GET /plain?missing=1&x=1 answered 404 at concurrency 1: give a request the "
        "deployment serves. Nothing was measured."
    )


def test_a_fastapi_route_that_does_not_exist_answers_404_and_fails(shapes_app):
    message = error_of(
        run_script(
            shapes_app,
            "--import-path",
            "shapes_app:API",
            "--request",
            json.dumps({"kind": "http", "method": "GET", "path": "/nowhere"}),
        )
    )
    assert "GET /nowhere answered 404 at concurrency 1" in message


@pytest.mark.parametrize(
    "import_path, request_, fragment",
    [
        (
            "shapes_app:Exploding",
            {"kind": "handle", "args": []},
            "shapes_app:Exploding could not be built: RuntimeError: weights not found",
        ),
        (
            "shapes_app:Plain",
            {"kind": "http", "path": "/plain"},
            "The representative request GET /plain failed at concurrency 1: JSONDecodeError",
        ),
        (
            "shapes_app:API",
            {"kind": "handle", "args": []},
            "is an ASGI (@serve.ingress) app: it is calibrated with an HTTP request",
        ),
    ],
)
def test_an_app_that_raises_fails_the_calibration_with_the_exception(shapes_app, import_path, request_, fragment):
    assert fragment in error_of(run_script(shapes_app, "--import-path", import_path, "--request", json.dumps(request_)))


def node_used() -> int:
    from apps.calibration import job_script

    return job_script.node_memory()[1]


def margin() -> int:
    from apps.calibration import job_script

    total, _ = job_script.node_memory()
    return max(job_script.MIN_MARGIN_BYTES, int(job_script.MARGIN_FRACTION * total))


# The script itself (Python, Serve, FastAPI imported) takes about 150 MiB of the node, and other
# processes on a shared machine move its usage too: the budgets leave hundreds of MiB either side
# of each prediction.
ROOM = 1024 * MIB


def test_a_first_level_that_would_cross_the_budget_is_not_run(shapes_app):
    request = {"kind": "handle", "args": ["x", 256]}
    message = error_of(
        run_script(
            shapes_app,
            "--import-path",
            "shapes_app:Handle",
            "--request",
            json.dumps(request),
            "--levels",
            "8",
            "--stop-at-bytes",
            str(node_used() + margin() + ROOM),
        )
    )
    assert "concurrency 8 would exceed the memory budget" in message and message.endswith("nothing was pushed.")


def test_levels_whose_predicted_peak_crosses_the_budget_are_left_out_with_the_reason(shapes_app):
    # 512 MiB a request against 2.5 GiB of room: level 2 fits and level 8 does not with 1.5 GiB to
    # spare either way, so the rest of the node's memory moving while the script runs cannot flip it.
    request = {"kind": "handle", "args": ["x", 512]}
    result = result_of(
        run_script(
            shapes_app,
            "--import-path",
            "shapes_app:Handle",
            "--request",
            json.dumps(request),
            "--levels",
            "1,2,8",
            "--stop-at-bytes",
            str(node_used() + margin() + 2560 * MIB),
        )
    )
    assert [p["concurrency"] for p in result["points"]] == [1, 2]
    assert result["limit_reason"].startswith("concurrency 8 would exceed the memory budget")


def test_the_sampler_ends_a_level_that_crosses_the_budget_and_keeps_the_levels_before(shapes_app):
    # Levels 1 and 2 look cheap (4 MiB a request); level 2's calls then take 1,536 MiB each.
    result = result_of(
        run_script(
            shapes_app,
            "--import-path",
            "shapes_app:Growing",
            "--levels",
            "1,2,4",
            "--stop-at-bytes",
            str(node_used() + margin() + ROOM),
            env={"GROWING_MB": "1536"},
        )
    )
    assert [p["concurrency"] for p in result["points"]] == [1]
    assert "during concurrency 2" in result["limit_reason"] and "the run ended there" in result["limit_reason"]


# --- a weighted mix of requests ------------------------------------------------------------------


def plain_post(mb: int, query: str = "") -> dict:
    return {"kind": "http", "method": "POST", "path": "/plain", "query": query or f"mb={mb}", "json": {"extra_mb": 0}}


def test_each_request_of_a_mix_is_measured_on_its_own(shapes_app):
    mix = [{"request": plain_post(16), "share": 80}, {"request": plain_post(64), "share": 20}]
    result = result_of(
        run_script(shapes_app, "--import-path", "shapes_app:Plain", "--mix", json.dumps(mix), "--levels", "1,2")
    )
    parsed = parse_output("FLEETDECK_CALIBRATION " + json.dumps(result))
    assert [(e["label"], e["share"]) for e in parsed["mix"]] == [("POST /plain?mb=16", 80), ("POST /plain?mb=64", 20)]
    # The largest share's levels stand for the curve.
    assert result["points"] == result["mix"][0]["points"]
    small, large = (per_request_mib({**result, "points": e["points"]}) for e in result["mix"])
    assert all(14 <= mib <= 22 for mib in small) and all(58 <= mib <= 72 for mib in large), (small, large)
    assert all(len(p["peak_samples"]) == 3 for e in result["mix"] for p in e["points"])


def test_a_request_of_a_mix_that_fails_is_named_and_nothing_is_measured(shapes_app):
    mix = [{"request": plain_post(16), "share": 50}, {"request": plain_post(0, "missing=1"), "share": 50}]
    message = error_of(run_script(shapes_app, "--import-path", "shapes_app:Plain", "--mix", json.dumps(mix)))
    assert message == (
        "mix[1] (POST /plain?missing=1) answered 404 at concurrency 1: give a request the deployment serves. Nothing "
        "was measured."
    )


def test_a_request_of_a_mix_that_alone_would_cross_the_budget_stops_the_calibration(shapes_app):
    mix = [
        {"request": {"kind": "handle", "args": ["x", 4]}, "share": 90},
        {"request": {"kind": "handle", "args": ["x", 700]}, "share": 10},
    ]
    message = error_of(
        run_script(
            shapes_app,
            "--import-path",
            "shapes_app:Handle",
            "--mix",
            json.dumps(mix),
            "--levels",
            "2",
            "--stop-at-bytes",
            str(node_used() + margin() + ROOM),
        )
    )
    assert message.startswith('concurrency 2 of mix[1] (handle call __call__("x", 700)) would exceed the memory budget')
    assert message.endswith(
        'mix[1] (handle call __call__("x", 700)) has no level within the budget, so the mix is not calibrated; '
        "nothing was pushed."
    )
