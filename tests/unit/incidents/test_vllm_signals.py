"""vLLM's engine metrics as Ray re-exports them: read per served model, tied to the serve.llm
deployment by `model_name`, a stuck engine opening an incident, a full KV cache ranked as a
latency cause.

The scrapes are Prometheus text with the names vLLM's Ray wrapper exports
(vllm/v1/metrics/ray_wrappers.py: `vllm:` sanitised to `_`, Ray's `ray_` prefix, `_total` on
counters) and the labels Ray's own LLM dashboard filters on (model_name, WorkerId, ReplicaId="")."""

from __future__ import annotations

import pytest

from apps.fleet import metric_readings
from apps.fleet.metric_readings import EngineSignals
from apps.incidents import detectors, ingest
from apps.incidents.causes import LatencyContext, rank_latency_causes
from apps.incidents.models import Incident, SignalWindow
from integrations import ray_metrics
from tests.factories import ClusterFactory
from tests.llm_world import MODEL_ID, SERVER, llm_deployment

BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0)


def engine(
    worker: str, *, running: int, waiting: int, kv: float, generated: float, preempted: float, ttft: dict[float, int]
) -> str:
    """One vLLM engine's series, as one worker exports them."""
    labels = f'model_name="{MODEL_ID}",engine="0",WorkerId="{worker}",ReplicaId="",Component="core_worker"'
    lines = [
        f"ray_vllm_num_requests_running{{{labels}}} {running}",
        f"ray_vllm_num_requests_waiting{{{labels}}} {waiting}",
        f"ray_vllm_kv_cache_usage_perc{{{labels}}} {kv}",
        f"ray_vllm_generation_tokens_total{{{labels}}} {generated}",
        f"ray_vllm_num_preemptions_total{{{labels}}} {preempted}",
    ]
    cumulative = 0
    for bound in (*BUCKETS, float("inf")):
        cumulative += ttft.get(bound, 0)
        le = "+Inf" if bound == float("inf") else repr(bound)
        lines.append(f'ray_vllm_time_to_first_token_seconds_bucket{{{labels},le="{le}"}} {cumulative}')
    lines.append(f"ray_vllm_time_to_first_token_seconds_count{{{labels}}} {cumulative}")
    return "\n".join(lines)


HEADER = """# HELP ray_vllm_num_requests_running Number of requests in model execution batches.
# TYPE ray_vllm_num_requests_running gauge
# HELP ray_vllm_num_requests_waiting Number of requests waiting to be processed.
# TYPE ray_vllm_num_requests_waiting gauge
# HELP ray_vllm_kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE ray_vllm_kv_cache_usage_perc gauge
# HELP ray_vllm_generation_tokens_total Number of generation tokens processed.
# TYPE ray_vllm_generation_tokens_total counter
# HELP ray_vllm_num_preemptions_total Cumulative number of preemption from the engine.
# TYPE ray_vllm_num_preemptions_total counter
# HELP ray_vllm_time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE ray_vllm_time_to_first_token_seconds histogram
"""


def scrape(at: float, *engines: str) -> ray_metrics.Scrape:
    return metric_readings.relevant(ray_metrics.parse(HEADER + "\n".join(engines) + "\n", at=at))


def test_two_engines_of_one_model_are_read_together():
    before = scrape(
        100.0,
        engine("w1", running=4, waiting=0, kv=0.4, generated=1000, preempted=2, ttft={0.5: 10}),
        engine("w2", running=3, waiting=1, kv=0.5, generated=800, preempted=0, ttft={0.5: 8}),
    )
    after = scrape(
        130.0,
        engine("w1", running=8, waiting=3, kv=0.97, generated=1600, preempted=7, ttft={0.5: 10, 5.0: 5}),
        engine("w2", running=6, waiting=2, kv=0.6, generated=1300, preempted=0, ttft={0.5: 8, 2.5: 5}),
    )
    reading = metric_readings.read(before, after)
    signals = reading.engines[MODEL_ID]
    assert (signals.running, signals.waiting, signals.kv_usage) == (14, 5, 0.97)
    assert (signals.generated_tokens, signals.preemptions) == (1100, 5)
    # Ten first tokens in the interval: five in 1-2.5 s, five in 2.5-5 s; the p99 lies in the last.
    assert 2500 < signals.ttft_p99_ms <= 5000
    point = metric_readings.point(130.0, 30.0, metric_readings.DeploymentSignals(), engine=signals)
    assert (point["llm_waiting"], point["gen_tokens"], point["kv_usage"], point["preemptions"]) == (5, 1100, 0.97, 5)
    assert 2.5 < point["ttft_p99"] <= 5.0


def test_a_scrape_without_vllm_has_no_engines():
    assert metric_readings.read(ray_metrics.Scrape(at=0), ray_metrics.Scrape(at=30)).engines == {}


def stuck_points(n: int, *, waiting: float = 4, tokens: float = 0) -> list[dict]:
    return [
        {"t": 30.0 * i, "seconds": 30.0, "llm_waiting": waiting, "llm_running": 0, "gen_tokens": tokens}
        for i in range(n)
    ]


def test_waiting_requests_and_no_tokens_for_three_readings_is_a_stuck_engine():
    finding = detectors.engine_stuck(stuck_points(3))
    assert finding is not None and finding.kind == "engine_stuck"
    assert finding.summary == (
        "4 request(s) waiting in the engine and no token generated for 3 readings (90 s), while Serve reports "
        "the replica healthy."
    )
    assert detectors.engine_stuck(stuck_points(2)) is None  # not for long enough yet
    assert detectors.engine_stuck(stuck_points(3, tokens=12)) is None  # slow, but generating
    assert detectors.engine_stuck(stuck_points(3, waiting=0)) is None  # idle, not stuck
    # A reading without engine series says nothing: not "no tokens".
    assert detectors.engine_stuck([*stuck_points(2), {"t": 90.0, "seconds": 30.0}]) is None


def test_a_full_kv_cache_is_named_first_among_the_latency_causes():
    ctx = LatencyContext(
        cold_start=False,
        queue_building=False,
        ongoing=4,
        queued=0,
        max_ongoing_requests=256,
        running_replicas=1,
        at_max_replicas=False,
        memory_pressure=False,
        kv_cache_full=True,
        preemptions=12,
    )
    causes = rank_latency_causes(ctx)
    assert causes[0]["id"] == "LAT-9" and "preempted 12 sequence(s)" in causes[0]["reason"]
    assert [r["id"] for r in causes[0]["remedies"]] == ["R1", "R3"]


@pytest.mark.django_db
def test_a_stuck_engine_behind_a_healthy_replica_opens_an_incident_on_its_deployment(team, monkeypatch):
    cluster = ClusterFactory(team=team, metrics_url="http://llm.test:8080/metrics")
    llm_deployment(cluster)
    frozen = dict(running=0, waiting=6, kv=0.2, generated=5000, preempted=0, ttft={0.5: 40})
    scrapes = iter(scrape(100.0 + 30 * i, engine("w1", **frozen)) for i in range(5))
    monkeypatch.setattr(ingest.ray_metrics, "scrape", lambda url, timeout_s, names=None: next(scrapes))

    touched = [ingest.collect_metrics(cluster.pk) for _ in range(4)]

    assert touched[:3] == [[], [], []]  # the first scrape only starts the rates; then two readings
    [incident_id] = touched[3]
    incident = Incident.objects.get(pk=incident_id)
    assert incident.kind == Incident.Kind.ENGINE_STUCK
    assert (incident.application_name, incident.deployment_name) == ("llm", SERVER)
    assert incident.causes[0]["id"] == "LLM-1" and incident.causes[0]["remedies"][0]["id"] == "R8"
    assert incident.severity == "major"
    window = SignalWindow.objects.get(cluster=cluster, deployment_name=SERVER)
    assert window.points[-1]["llm_waiting"] == 6 and window.points[-1]["gen_tokens"] == 0
    # The next reading extends the same incident instead of opening another.
    assert ingest.collect_metrics(cluster.pk) == [incident_id]
    assert Incident.objects.get(pk=incident_id).signal_count == 2


def test_engine_signals_default_to_nothing_seen():
    assert EngineSignals() == EngineSignals(0.0, 0.0, None, 0.0, 0.0, None)
