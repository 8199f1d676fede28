"""Shadow scalers on the tick: their policy and signals come from what the sync and its metrics
reading stored, their decisions are recorded, and Ray is never asked to scale."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.core import ticks
from apps.incidents.models import Incident, NodeWindow, OomKillRecord
from apps.scaler import policy as policies
from apps.scaler import shadow
from apps.scaler.models import Scaler, ScalerDecision
from apps.scaler.readings import sample_of
from apps.scaler.services import create_shadow_scaler
from tests.factories import IncidentFactory
from tests.unit.scaler.conftest import GIB, MIB, record_readings

MB = 10**6  # Ray's unit of process memory

pytestmark = pytest.mark.django_db


@pytest.fixture
def scaler(model, calibrated, operator) -> Scaler:
    return create_shadow_scaler(operator, model, min_replicas=1, max_replicas=8)


def test_the_policy_comes_from_the_calibration_the_nodes_and_the_deployment(scaler):
    built = policies.build(scaler)
    policy = built.policy
    assert policy.concurrency == 4  # the highest measured level, under max_ongoing_requests 8
    assert policy.service_s == 0.5
    assert policy.peak_bytes == 1536 * MIB
    assert policy.queue_bound == 100  # the deployment's max_queued_requests
    # Memory: (0.95 * 16 GiB - 8 GiB + the running replica's 512 MiB at rest, less the unmeasured
    # 20 % margin) // 1.5 GiB = 6.16 GiB // 1.5 GiB = 4.
    # Resources: 2 CPUs less what the other deployments hold, 0.2 CPU each: 9.
    assert policy.memory_ceiling == 4
    assert "memory holds 4" in built.ceiling_reason and "CPU schedules" in built.ceiling_reason


def test_a_kill_that_named_a_lower_threshold_lowers_the_memory_ceiling(scaler, model):
    # The operator lowered RAY_memory_usage_threshold to 0.75: the monitor kills at 12 GiB of 16, so
    # 4 GiB are left above the 8 used, not 7.2; with the running replica's 512 MiB and less the margin,
    # 3.6 GiB hold 2 replicas of 1.5 GiB at their peak.
    incident = IncidentFactory(cluster=model.application.cluster, kind="oom_kill", deployment=model)
    OomKillRecord.objects.create(
        incident=incident,
        actor_id="a" * 32,
        replica="r",
        node_ip="10.0.0.1",
        used_bytes=12 * GIB,
        threshold_bytes=12 * GIB,
    )
    built = policies.build(scaler)
    assert built.policy.memory_ceiling == 2
    assert "kill threshold, 75% of node memory" in built.ceiling_reason and "named 12.00 GiB" in built.ceiling_reason
    assert "running replica(s) at their calibrated 512 MiB at rest" in built.ceiling_reason


def test_the_running_replicas_memory_is_room_they_grow_into_not_room_taken(scaler, model):
    # Two replicas read at 3 GiB together (Ray's MB): of the 8 GiB used, they may grow into those 3.
    # (0.95 * 16 - 8 + 3) GiB less 20 % = 8.16 GiB // 1.5 GiB = 5 (not 4 with the rest at 512 MiB).
    record_readings(model, [1, 1, 1], rss_mb=3 * GIB / MB, replicas=2)
    built = policies.build(scaler)
    assert built.policy.memory_ceiling == 5 and "its replicas hold 3,072 MiB now" in built.ceiling_reason


def test_only_the_replicas_own_memory_is_room_shared_pages_are_not(scaler, model):
    # The same two replicas, 2.5 GiB resident but 1 GiB of it pages all workers share: the node gets
    # 1.5 GiB back if they go. (7.2 + 1.5) GiB less 20 % = 6.96 GiB // 1.5 GiB = 4, where their
    # resident memory (7.2 + 2.5 GiB less 20 % = 7.76 GiB) would have let in 5 that OOM.
    record_readings(model, [1, 1, 1], rss_mb=2.5 * GIB / MB, uss_mb=1.5 * GIB / MB, replicas=2)
    built = policies.build(scaler)
    assert built.policy.memory_ceiling == 4, built.ceiling_reason
    assert "its replicas hold 1,536 MiB of their own now" in built.ceiling_reason


def test_a_newer_reading_without_the_nodes_memory_does_not_drop_the_memory_ceiling(scaler, model):
    window = NodeWindow.objects.get(cluster=model.application.cluster)
    window.save_points([*window.points, {"t": time.time(), "mem_used": 0.0, "mem_total": 0.0, "evictions": 1}])
    built = policies.build(scaler)
    assert built.policy.memory_ceiling == 4 and "memory holds 4" in built.ceiling_reason


def test_a_scalers_own_concurrency_and_service_time_override_the_calibration(scaler):
    scaler.concurrency, scaler.service_s = 2, 0.25
    policy = policies.build(scaler).policy
    assert (policy.concurrency, policy.service_s, policy.peak_bytes) == (2, 0.25, 1024 * MIB)


def test_a_burst_is_recorded_as_what_the_scaler_would_have_done_and_ray_is_not_asked(scaler, model, use_replay):
    record_readings(model, [2, 2, 2, 24])  # 12 in flight at 4 per replica: three replicas
    decision = shadow.evaluate(scaler.pk)
    assert decision.kind == ScalerDecision.Kind.UP and (decision.current, decision.target) == (1, 3)
    assert decision.applied is False
    assert decision.inputs["panicking"] is True and decision.inputs["memory_ceiling"] == 4
    assert "memory holds 4" in decision.inputs["ceiling_reason"]
    assert not [r for r in use_replay.requests if r.url.path.endswith("/scale")]


def test_a_tick_with_no_newer_reading_records_nothing_new(scaler, model):
    record_readings(model, [2, 2, 2, 24])
    assert shadow.evaluate(scaler.pk) is not None
    assert shadow.evaluate(scaler.pk) is None
    assert scaler.decisions.count() == 1


def test_stale_readings_are_handed_back_once(scaler, model):
    record_readings(model, [2, 2, 24], end=time.time() - 600)
    first = shadow.evaluate(scaler.pk)
    assert first.kind == ScalerDecision.Kind.HAND_BACK and first.target == first.current == 1
    assert "old" in first.reason
    assert shadow.evaluate(scaler.pk) is None


def test_a_deployment_never_calibrated_is_handed_back_with_what_to_do(model, operator):
    scaler = create_shadow_scaler(operator, model, min_replicas=1, max_replicas=4)
    record_readings(model, [2, 2, 24])
    decision = shadow.evaluate(scaler.pk)
    assert decision.kind == ScalerDecision.Kind.HAND_BACK
    assert "calibrate it" in decision.reason


def test_replicas_above_the_calibrated_peak_lower_the_recorded_ceiling(scaler, model):
    # 4 replicas' worth of load, the one replica holding 2.4 GiB against a 1.5 GiB calibrated peak:
    # memory holds (7.2 + 2.4 GiB less 20 %) // 1.5 = 5 at the calibrated peak, 5 x 1.5 / 2.4 = 3 at this one.
    record_readings(model, [32, 32, 32], rss_mb=2.4 * GIB / MB, replicas=1)
    decision = shadow.evaluate(scaler.pk)
    assert decision.kind == ScalerDecision.Kind.AT_CEILING and decision.target == 3
    assert "max_queued_requests 100" in decision.reason


def test_an_oom_kill_of_the_deployment_keeps_it_at_the_count_running(scaler, model):
    incident = IncidentFactory(cluster=model.application.cluster, deployment=model, kind=Incident.Kind.OOM_KILL)
    OomKillRecord.objects.create(incident=incident, actor_id="a1", replica="r1")
    record_readings(model, [2, 2, 24])
    decision = shadow.evaluate(scaler.pk)
    assert decision.kind == ScalerDecision.Kind.AT_CEILING and decision.target == 1
    assert "OOM kill" in decision.reason


def test_a_replica_still_starting_holds_the_count(scaler, model):
    model.target_replicas, model.running_replicas, model.waiting_replicas = 2, 1, 1
    model.save()
    record_readings(model, [24, 24, 24])
    decision = shadow.evaluate(scaler.pk)
    assert decision.kind == ScalerDecision.Kind.HOLD and decision.target == 2
    assert "still starting" in decision.reason


def test_a_scale_up_holds_the_next_scale_down(scaler, model):
    end = time.time()
    record_readings(model, [2, 2, 24], end=end - 60)
    assert shadow.evaluate(scaler.pk).kind == ScalerDecision.Kind.UP
    model.target_replicas = model.running_replicas = 3
    model.save()
    record_readings(model, [2, 2, 24, 0, 0, 0, 0, 0, 0], end=end)
    held = shadow.evaluate(scaler.pk)
    assert held.kind == ScalerDecision.Kind.HOLD and "no scale-down before" in held.reason


def test_the_tick_decides_shadow_scalers_that_are_due_and_no_others(scaler, model, operator, cluster):
    record_readings(model, [2, 2, 24])
    echo = model.application.deployments.get(name="Echo")
    off = Scaler.objects.create(deployment=echo, mode=Scaler.Mode.OFF, max_replicas=2)
    handlers = dict(ticks.named_handlers())
    assert handlers["scaler.shadow"] is shadow.decide_shadows

    shadow.decide_shadows()
    scaler.refresh_from_db()
    off.refresh_from_db()
    assert scaler.evaluated_at is not None and scaler.decisions.count() == 1
    assert off.evaluated_at is None and not off.decisions.exists()

    # Decided a moment ago: not due again before the sync interval has passed.
    Scaler.objects.filter(pk=scaler.pk).update(evaluated_at=timezone.now() - timedelta(seconds=5))
    record_readings(model, [2, 2, 24, 40])
    shadow.decide_shadows()
    assert scaler.decisions.count() == 1
    Scaler.objects.filter(pk=scaler.pk).update(evaluated_at=timezone.now() - timedelta(hours=1))
    shadow.decide_shadows()
    assert scaler.decisions.count() == 2


def test_the_tick_takes_a_bounded_batch_longest_waiting_first(scaler, model, monkeypatch):
    echo = model.application.deployments.get(name="Echo")
    other = Scaler.objects.create(deployment=echo, max_replicas=2, evaluated_at=timezone.now() - timedelta(days=1))
    monkeypatch.setattr(shadow, "BATCH", 1)
    shadow.decide_shadows()
    assert Scaler.objects.get(pk=scaler.pk).evaluated_at is not None  # never decided goes first
    assert Scaler.objects.get(pk=other.pk).evaluated_at < timezone.now() - timedelta(hours=1)


def test_one_scaler_that_fails_does_not_stop_the_others(scaler, model, monkeypatch):
    echo = model.application.deployments.get(name="Echo")
    other = Scaler.objects.create(deployment=echo, max_replicas=2)
    real = policies.build

    def broken_for_model(s):
        if s.pk == scaler.pk:
            raise RuntimeError("bad row")
        return real(s)

    monkeypatch.setattr(policies, "build", broken_for_model)
    shadow.decide_shadows()
    assert Scaler.objects.get(pk=scaler.pk).evaluated_at is not None
    assert Scaler.objects.get(pk=other.pk).decisions.count() == 1


def test_a_reading_counts_the_proxys_503s_as_arrivals_and_reads_memory_per_replica():
    sample = sample_of(
        {
            "t": 100.0,
            "rps": 10.0,
            "ongoing": 5,
            "queued": 2,
            "seconds": 30.0,
            "http_errors": {"503": 60, "500": 3},
            "http_p99": 900.0,
            "p99": 400.0,
            "rss_mb": 3 * GIB / MB,
            "replicas": 2,
        }
    )
    assert sample.arrival_rps == 12.0 and sample.shed == 60
    assert sample.p99_ms == 900.0
    assert sample.rss_bytes_per_replica == 1.5 * GIB
