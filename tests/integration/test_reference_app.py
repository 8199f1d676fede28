"""The reference Serve application on its own real Ray cluster: input caps, token-sum batching,
the bounded cache, warmup, memory figures, and the misbehaving mode driven by config alone.

The deployment is reference.json with two test-only changes: one fixed replica, so the stats
endpoint speaks for every request, and `max_ongoing_requests` 8 instead of 2, so that more
requests wait at the replica than fit one batch and the token budget, not the concurrency cap,
is what bounds a batch. Each test puts the user_config it needs in place (an in-place update)."""

from __future__ import annotations

import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import httpx
import pytest

from apps.demo.local_ray import REFERENCE_APP_DIR, LocalRayHead

pytestmark = pytest.mark.ray
MIB = 2**20
# A replica started by the deploy has warmed up in its constructor, so its first request may
# only be this many times slower than the typical one. Without the warmup the model alone costs
# about twice its warm time on the first batch; the margin absorbs a shared, noisy CPU.
COLD_START_FACTOR = 3


def shipped(name: str) -> dict:
    return json.loads((REFERENCE_APP_DIR / name).read_text())


def generator(config: dict) -> dict:
    return next(d for d in config["applications"][0]["deployments"] if d["name"] == "Generator")


SHIPPED_SETTINGS = generator(shipped("reference.json"))["user_config"]


def deployed_config(user_config: dict) -> dict:
    config = shipped("reference.json")
    deployment = generator(config)
    deployment.pop("autoscaling_config")
    deployment.update(num_replicas=1, max_ongoing_requests=8, user_config=user_config)
    return config


@pytest.fixture(scope="module")
def reference():
    """A private head (the session's `ray_head` serves the demo app other tests rely on) with
    the reference app deployed; the first eleven requests after the deploy are timed here, so the
    cold-start figures are right whichever tests run."""
    head = LocalRayHead.start()
    try:
        head.wait_ready()
        head.deploy(deployed_config(SHIPPED_SETTINGS))
        with httpx.Client(base_url=f"{head.serve_url}/reference", timeout=60) as client:
            latencies = []
            for i in range(11):
                started = time.perf_counter()
                answer = client.post("/", json={"prompt": f"first contact {i}", "max_tokens": 64})
                latencies.append(time.perf_counter() - started)
                assert answer.status_code == 200, answer.text
            yield SimpleNamespace(head=head, client=client, first_latencies=latencies)
    finally:
        head.stop()


def configure(reference, **changes) -> dict:
    """Put the shipped user_config with `changes` in place and wait until the replica runs it."""
    user_config = {**SHIPPED_SETTINGS, **changes}
    reference.head.deploy(deployed_config(user_config))
    deadline = time.monotonic() + 30
    while (stats := reference.client.get("/stats").json())["settings"] != user_config:
        assert time.monotonic() < deadline, f"the replica did not take {user_config}: {stats['settings']}"
        time.sleep(0.2)
    return stats


def generate(client: httpx.Client, prompt: str, max_tokens: int) -> httpx.Response:
    return client.post("/", json={"prompt": prompt, "max_tokens": max_tokens})


def test_the_first_request_after_a_deploy_is_not_a_cold_start(reference):
    first, *rest = reference.first_latencies
    typical = statistics.median(rest)
    print(f"\nfirst request {first * 1000:.0f} ms, median of the next ten {typical * 1000:.0f} ms")
    assert first <= COLD_START_FACTOR * typical
    assert reference.client.get("/stats").json()["warmup_s"] > 0


def test_oversized_input_is_refused_at_the_edge_with_a_clear_message(reference):
    configure(reference)
    client = reference.client
    max_prompt, max_tokens = SHIPPED_SETTINGS["max_prompt_tokens"], SHIPPED_SETTINGS["max_tokens_cap"]

    too_long = generate(client, "x" * (max_prompt + 1), 8)
    assert too_long.status_code == 413
    assert too_long.json() == {
        "error": "prompt_too_long",
        "detail": f"prompt is {max_prompt + 1} tokens (UTF-8 bytes); the limit is {max_prompt}",
    }
    # Tokens are bytes: fewer characters than the cap can still be too many tokens.
    accented = generate(client, "é" * (max_prompt // 2 + 1), 8)
    assert accented.status_code == 413 and f"prompt is {max_prompt + 2} tokens" in accented.json()["detail"]

    too_many = generate(client, "hello", max_tokens + 1)
    assert too_many.status_code == 422
    assert too_many.json() == {
        "error": "max_tokens_too_large",
        "detail": f"max_tokens is {max_tokens + 1}; the limit is {max_tokens}",
    }

    malformed = client.post("/", content=b'{"prompt": "unterminated')
    assert malformed.status_code == 400 and malformed.json()["error"] == "malformed_json"
    huge_body = client.post("/", content=b"x" * (max_prompt * 8 + 4096))
    assert huge_body.status_code == 413 and huge_body.json()["error"] == "body_too_large"

    at_the_caps = generate(client, "y" * max_prompt, max_tokens)
    assert at_the_caps.status_code == 200
    assert at_the_caps.json()["prompt_tokens"] == max_prompt and at_the_caps.json()["completion_tokens"] == max_tokens


def test_batches_never_exceed_the_token_budget_under_concurrent_load(reference):
    batches_before = configure(reference)["batches"]["count"]
    budget = SHIPPED_SETTINGS["max_batch_tokens"]
    # Two of these fit in one batch, three do not.
    prompt_tokens, max_tokens = 300, 100
    single = prompt_tokens + max_tokens
    assert 2 * single <= budget < 3 * single

    with ThreadPoolExecutor(16) as pool:
        answers = list(
            pool.map(
                lambda i: generate(reference.client, f"{i:03d}" + "z" * (prompt_tokens - 3), max_tokens), range(16)
            )
        )

    assert [answer.status_code for answer in answers] == [200] * 16
    batches = reference.client.get("/stats").json()["batches"]
    print(f"\n16 concurrent requests of {single} tokens, budget {budget}: {batches}")
    assert single < batches["largest_token_sum"] <= budget
    assert batches["largest_size"] >= 2 and batches["count"] - batches_before < 16


def test_the_cache_stays_within_its_bound_and_answers_repeats(reference):
    bound = 8
    stats = configure(reference, cache_max_entries=bound)
    assert stats["cache"]["max_entries"] == bound
    client = reference.client
    for i in range(bound + 4):
        assert generate(client, f"distinct prompt {i}", 4).json()["cached"] is False
    stats = client.get("/stats").json()
    assert stats["cache"]["entries"] == bound

    hits = stats["requests"]["cache_hits"]
    repeat = generate(client, f"distinct prompt {bound + 3}", 4).json()
    evicted = generate(client, "distinct prompt 0", 4).json()
    assert repeat["cached"] is True and evicted["cached"] is False
    assert client.get("/stats").json()["requests"]["cache_hits"] == hits + 1


def test_cached_answers_expire_after_their_ttl(reference):
    configure(reference, cache_ttl_s=1)
    client = reference.client
    assert generate(client, "short-lived", 4).json()["cached"] is False
    assert generate(client, "short-lived", 4).json()["cached"] is True
    time.sleep(1.5)
    assert generate(client, "short-lived", 4).json()["cached"] is False


def test_the_replica_reports_its_memory_peaks_on_the_stats_route_and_as_ray_metrics(reference):
    memory = reference.client.get("/stats").json()["memory"]
    assert memory["peak_rss_bytes"] >= memory["rss_bytes"] > 100 * MIB
    assert memory["gpu_peak_bytes"] is None

    metrics_url = f"http://127.0.0.1:{reference.head.ports['metrics-export-port']}/metrics"
    deadline = time.monotonic() + 60
    while "ray_reference_app_peak_rss_bytes{" not in (text := httpx.get(metrics_url, timeout=10).text):
        assert time.monotonic() < deadline, "the peak RSS gauge never reached Ray's metrics endpoint"
        time.sleep(2)
    line = next(line for line in text.splitlines() if line.startswith("ray_reference_app_peak_rss_bytes{"))
    assert 'application="reference"' in line and float(line.rsplit(" ", 1)[1]) > 100 * MIB


def test_the_misbehaving_mode_takes_any_input_and_its_temporaries_raise_the_peak(reference):
    # misbehaving.json's settings with smaller temporaries: this machine is shared.
    settings = {
        **generator(shipped("misbehaving.json"))["user_config"],
        "scratch_kb_per_token": 64,
        "scratch_mb_per_request": 64,
    }
    before = configure(reference, **settings)
    prompt_tokens, max_tokens = 2 * SHIPPED_SETTINGS["max_prompt_tokens"], 2 * SHIPPED_SETTINGS["max_tokens_cap"]

    answer = generate(reference.client, "w" * prompt_tokens, max_tokens)

    assert answer.status_code == 200 and answer.json()["completion_tokens"] == max_tokens
    after = reference.client.get("/stats").json()
    temporaries = (prompt_tokens + max_tokens) * 64 * 1024 + 64 * MIB
    print(
        f"\nresident {before['memory']['rss_bytes'] / MIB:.0f} MiB, then a peak of "
        f"{after['memory']['peak_rss_bytes'] / MIB:.0f} MiB with {temporaries / MIB:.0f} MiB of temporaries"
    )
    assert after["memory"]["peak_rss_bytes"] >= before["memory"]["rss_bytes"] + 0.9 * temporaries
    assert after["batches"]["largest_token_sum"] == prompt_tokens + max_tokens
