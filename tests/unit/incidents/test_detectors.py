"""Detectors on synthetic traces: what must fire and what must not."""

from __future__ import annotations

import random

from apps.incidents import detectors


def trace(p99s, rps=5.0, queued=None, starts=None):
    return [
        {
            "t": 1000 + 30 * i,
            "p99": v,
            "rps": rps,
            "queued": (queued or [0] * len(p99s))[i],
            "starts": (starts or [0] * len(p99s))[i],
        }
        for i, v in enumerate(p99s)
    ]


def test_a_sustained_p99_far_above_its_baseline_is_a_spike():
    finding = detectors.latency_spike(trace([80, 90, 85, 95, 88, 900, 1200]))
    assert finding and finding.peak == 1200 and finding.baseline == 88


def test_noise_is_not_a_spike():
    random.seed(7)
    assert detectors.latency_spike(trace([90 + random.uniform(-30, 30) for _ in range(40)])) is None


def test_one_slow_reading_is_not_a_spike():
    assert detectors.latency_spike(trace([80, 90, 85, 95, 88, 1500, 90])) is None


def test_a_rise_that_stays_under_the_floor_is_not_a_spike():
    assert detectors.latency_spike(trace([20, 22, 21, 20, 23, 200, 240])) is None


def test_readings_without_traffic_never_spike():
    assert detectors.latency_spike(trace([80, 90, 85, 95, 88, 900, 1200], rps=0)) is None


def test_without_a_baseline_only_a_large_absolute_latency_counts():
    assert detectors.latency_spike(trace([300, 400])) is None
    assert detectors.latency_spike(trace([900, 1000])) is not None


def test_replica_starts_mark_a_cold_start_and_a_deploy_alone_does_not_spike():
    deploy = trace([80, 90, 85, 95, 88, 92, 90], starts=[0, 0, 0, 0, 0, 2, 0])
    assert detectors.latency_spike(deploy) is None
    assert detectors.cold_start(deploy)
    assert not detectors.cold_start(trace([80, 90, 85, 95, 88, 92, 90]))


def test_a_growing_queue_is_a_build_up_and_a_steady_one_is_not():
    assert detectors.queue_building(trace([1] * 5, queued=[0, 0, 2, 6, 12]))
    assert not detectors.queue_building(trace([1] * 5, queued=[5, 5, 5, 5, 5]))
    assert not detectors.queue_building(trace([1] * 5, queued=[0, 0, 0, 1, 1]))


def node(points):
    return [{"t": t, "mem": m} for t, m in points]


def test_memory_pressure_needs_sustained_readings_near_the_limit():
    assert detectors.memory_pressure(node([(0, 0.5), (30, 0.92), (60, 0.95)]))
    assert detectors.memory_pressure(node([(0, 0.5), (30, 0.95), (60, 0.6)])) is None
    assert detectors.memory_pressure([{"t": 0, "gpu": 0.97}, {"t": 30, "gpu": 0.98}], key="gpu").summary.startswith(
        "Node GPU memory"
    )


def test_a_ratchet_is_growth_over_hours_that_never_comes_back():
    assert detectors.memory_ratchet(node([(h * 3600.0, 0.40 + 0.03 * h) for h in range(5)]))
    assert (
        detectors.memory_ratchet(node([(h * 3600.0, 0.40 + (0.03 if h % 2 else 0) + 0.01 * h) for h in range(5)]))
        is None
    )
    assert detectors.memory_ratchet(node([(h * 600.0, 0.40 + 0.05 * h) for h in range(5)])) is None  # not over hours
    tiny_dips = [(h * 1800.0, 0.40 + 0.03 * h - (0.005 if h == 3 else 0)) for h in range(9)]
    assert detectors.memory_ratchet(node(tiny_dips))
