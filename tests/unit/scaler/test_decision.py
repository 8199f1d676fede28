"""The scaler's decision on recorded signal sequences: readings 30 s apart, as the sync takes them.
Each sequence is replayed as an active scaler would live it: the target a decision sets is the
deployment's target at the next reading."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

import pytest

from apps.scaler.decision import Current, Decision, Kind, Policy, Sample, Signals, decide, in_flight, needed

GIB = 2**30
STEP_S = 30.0
T0 = 1_700_000_000.0

# 4 requests per replica, half a second each: one replica serves 8 requests per second.
POLICY = Policy(
    concurrency=4,
    service_s=0.5,
    min_replicas=1,
    max_replicas=10,
    memory_ceiling=8,
    peak_bytes=1 * GIB,
    queue_bound=20,
)


def reading(i: int, rps: float, *, queued: float = 0.0, **extra) -> Sample:
    """The i-th reading of a deployment receiving `rps` requests per second."""
    return Sample(at=T0 + i * STEP_S, ongoing=rps * POLICY.service_s, queued=queued, arrival_rps=rps, **extra)


def signals(samples: list[Sample], target: int, *, running: int | None = None, starting: int = 0, **extra) -> Signals:
    now = samples[-1].at if samples else T0
    current = Current(target=target, running=target if running is None else running, starting=starting)
    return Signals(now=now, samples=tuple(samples), current=current, **extra)


def replay(rates: list[float], target: int = 1, policy: Policy = POLICY) -> list[Decision]:
    """Live through `rates` (one per reading) as an active scaler: each decision's target runs
    from the next reading on."""
    samples: list[Sample] = []
    decisions = []
    last_up = None
    for i, rps in enumerate(rates):
        samples.append(reading(i, rps))
        decision = decide(signals(samples, target, last_upscale_at=last_up), policy)
        decisions.append(decision)
        if decision.kind == Kind.UP:
            last_up = samples[-1].at
        target = decision.target
    return decisions


def targets(decisions: list[Decision]) -> list[int]:
    return [d.target for d in decisions]


def reversals(decisions: list[Decision]) -> int:
    moves = [d.kind for d in decisions if d.kind in Kind.moving()]
    return sum(1 for a, b in pairwise(moves) if a != b)


# --- the arithmetic ------------------------------------------------------------------------------


def test_littles_law_needs_arrival_rate_times_service_time_over_concurrency_plus_the_queue():
    sample = reading(0, rps=24, queued=4)  # 12 in service + 4 waiting
    assert in_flight(sample, POLICY) == 16
    assert needed(in_flight(sample, POLICY), POLICY) == 4


def test_in_flight_is_never_less_than_what_replicas_held_when_the_rate_is_unknown():
    sample = Sample(at=T0, ongoing=9, queued=0, arrival_rps=None)
    assert in_flight(sample, POLICY) == 9


def test_a_load_that_fills_replicas_exactly_needs_no_extra_one():
    assert needed(8.0, POLICY) == 2
    assert needed(8.0000001, POLICY) == 2
    assert needed(8.1, POLICY) == 3


# --- sequences -----------------------------------------------------------------------------------


def test_a_burst_jumps_at_once_to_what_the_short_window_needs():
    decisions = replay([4, 4, 4, 4, 4, 48])  # 2 in flight, then 24: six replicas' worth
    assert targets(decisions)[:5] == [1, 1, 1, 1, 1]
    burst = decisions[-1]
    assert burst.kind == Kind.UP and burst.target == 6
    assert burst.inputs.panicking and burst.inputs.panic_needed == 6
    assert burst.reason.startswith("Burst:")


def test_a_ramp_is_followed_up_and_never_down():
    decisions = replay([8, 16, 24, 32, 40, 48, 56])
    assert targets(decisions) == sorted(targets(decisions))
    assert targets(decisions)[-1] >= 5
    assert all(d.kind in (Kind.UP, Kind.HOLD) for d in decisions)


def test_an_idle_deployment_stays_at_its_minimum():
    decisions = replay([0] * 12, target=1)
    assert targets(decisions) == [1] * 12
    assert all(d.kind == Kind.HOLD for d in decisions)


def test_a_deployment_that_went_idle_comes_down_one_replica_at_a_time():
    decisions = replay([0] * 6, target=5)
    assert targets(decisions) == [4, 3, 2, 1, 1, 1]
    assert [d.kind for d in decisions][:4] == [Kind.DOWN] * 4


def test_flapping_traffic_reverses_at_most_once_per_burst():
    # A burst every two minutes: up at the first, then no scale-down inside the hold.
    rates = [48 if i % 4 == 0 else 4 for i in range(20)]  # 20 readings: ten minutes
    decisions = replay(rates)
    assert decisions[0].kind == Kind.UP
    assert reversals(decisions) <= 1
    held = [d for d in decisions if "no scale-down before" in d.reason or "would not hold" in d.reason]
    assert held, "the quiet readings between bursts were held, not scaled down"


def test_after_the_hold_a_quiet_deployment_does_come_down():
    rates = [48] + [0] * 30  # one burst, then fifteen quiet minutes
    decisions = replay(rates)
    assert decisions[0].target == 6
    assert targets(decisions)[-1] == 1
    down_at = next(i for i, d in enumerate(decisions) if d.kind == Kind.DOWN)
    assert down_at * STEP_S >= POLICY.downscale_hold_s


def test_stale_metrics_hand_the_count_back():
    samples = [reading(i, 40) for i in range(5)]
    late = replace(signals(samples, 2), now=samples[-1].at + 200)
    decision = decide(late, POLICY)
    assert decision.kind == Kind.HAND_BACK and decision.target == 2
    assert "200 s old" in decision.reason
    assert decision.inputs.signals_age_s == 200


def test_no_readings_at_all_hand_the_count_back():
    decision = decide(signals([], 3), POLICY)
    assert decision.kind == Kind.HAND_BACK and decision.target == 3


def test_replicas_that_never_start_are_not_joined_by_more():
    samples = []
    for i in range(10):
        samples.append(reading(i, 40))  # 20 in flight: 5 replicas' worth
        decision = decide(signals(samples, 3, running=2, starting=1), POLICY)
        assert decision.kind == Kind.HOLD and decision.target == 3
    assert "1 replica(s) are still starting" in decision.reason


def test_replicas_above_their_calibrated_memory_lower_the_ceiling():
    # Replicas hold 1.6 GiB against a 1 GiB calibrated peak: 8 would be 5 by memory.
    samples = [reading(i, 80, rss_bytes_per_replica=1.6 * GIB) for i in range(3)]  # 40 in flight: 10 replicas
    decision = decide(signals(samples, 4), POLICY)
    assert decision.kind == Kind.AT_CEILING and decision.target == 5
    assert decision.inputs.memory_ceiling == 5
    assert "calibrated peak of 1,024 MiB" in decision.reason
    assert "max_queued_requests 20" in decision.reason and "503s instead of an OOM kill" in decision.reason


def test_memory_within_tolerance_of_the_curve_keeps_the_calibrated_ceiling():
    samples = [reading(i, 80, rss_bytes_per_replica=1.05 * GIB) for i in range(3)]
    decision = decide(signals(samples, 4), POLICY)
    assert decision.kind == Kind.AT_CEILING and decision.target == 8
    assert "hold 8 replica(s)" in decision.reason


def test_without_a_queue_bound_at_the_ceiling_it_says_to_set_one():
    samples = [reading(i, 80) for i in range(3)]
    decision = decide(signals(samples, 8), replace(POLICY, queue_bound=None))
    assert decision.kind == Kind.AT_CEILING
    assert "set a queue bound" in decision.reason


def test_an_oom_kill_stops_scaling_up_at_the_count_running_now():
    samples = [reading(i, 40) for i in range(3)]
    decision = decide(signals(samples, 2, oom_kills=(samples[-1].at - 10,)), POLICY)
    assert decision.kind == Kind.AT_CEILING and decision.target == 2
    assert "1 OOM kill(s)" in decision.reason
    old_kill = decide(signals(samples, 2, oom_kills=(samples[-1].at - 3600,)), POLICY)
    assert old_kill.kind == Kind.UP


def test_a_scale_down_waits_until_the_load_fits_in_one_replica_fewer():
    holding = decide(signals([reading(0, 16.4)], 3), POLICY)  # 8.2 in flight: 2 replicas hold 8
    assert holding.kind == Kind.HOLD and holding.target == 3
    fits = decide(signals([reading(0, 15.8)], 3), POLICY)  # 7.9 in flight
    assert fits.kind == Kind.DOWN and fits.target == 2


def test_a_recent_burst_in_the_short_window_holds_a_scale_down():
    samples = [reading(i, 0) for i in range(9)] + [reading(9, 20)]  # quiet, then 10 in flight now
    decision = decide(signals(samples, 3), POLICY)
    assert decision.kind == Kind.HOLD and "would not hold the recent peak" in decision.reason


def test_the_count_stays_within_the_policys_bounds():
    assert decide(signals([reading(0, 400)], 2), replace(POLICY, memory_ceiling=None)).target == 10
    assert decide(signals([reading(0, 0)], 2), replace(POLICY, min_replicas=2)).kind == Kind.HOLD


def test_p99_over_the_objective_with_a_queue_adds_one_replica():
    slow = replace(POLICY, latency_objective_ms=1000)
    samples = [reading(0, 8, queued=1, p99_ms=2500)]  # the arithmetic says 2 would do
    decision = decide(signals(samples, 2), slow)
    assert decision.kind == Kind.UP and decision.target == 3
    assert "p99 2500 ms is over the 1000 ms objective" in decision.reason


@pytest.mark.parametrize("kind", list(Kind))
def test_every_kind_has_a_value_the_database_can_hold(kind):
    assert 1 <= len(kind.value) <= 16


def test_a_decision_carries_the_inputs_it_used():
    decision = decide(signals([reading(0, 24, queued=4, shed=3, p99_ms=800)], 2), POLICY)
    inputs = decision.inputs.as_dict()
    assert inputs["stable_in_flight"] == 16 and inputs["stable_needed"] == 4
    assert inputs["shed"] == 3 and inputs["p99_ms"] == 800
    assert inputs["concurrency"] == 4 and inputs["service_s"] == 0.5 and inputs["memory_ceiling"] == 8


def test_a_memory_ceiling_under_the_floor_never_scales_to_zero():
    # Under load a node can read full, and a ceiling computed then holds no replica at all: the
    # benchmark's first run sent a target of 0 in the middle of a burst.
    policy = replace(POLICY, memory_ceiling=0, min_replicas=1)
    decision = decide(signals([reading(0, 40), reading(1, 40)], 2), policy)
    assert decision.kind == Kind.AT_CEILING and decision.target == 1
    assert "fewer than min_replicas: the floor of 1 stays" in decision.reason


def test_after_an_oom_kill_the_ceiling_is_one_fewer_than_ran_at_the_kill():
    # Four ran when a replica was killed: four do not fit, whatever the calibration said; holding
    # four (the count running now) let the benchmark's ramp be killed a second time.
    samples = [reading(i, 40) for i in range(3)]
    decision = decide(signals(samples, 4, oom_kills=(samples[-1].at - 10,), killed_at_replicas=4), POLICY)
    assert decision.kind == Kind.AT_CEILING and decision.target == 3
    assert "with 4 replica(s) running: at most 3" in decision.reason
    # A kill with one replica running never scales to zero.
    alone = decide(signals(samples, 1, oom_kills=(samples[-1].at - 10,), killed_at_replicas=1), POLICY)
    assert alone.target == 1


def test_the_replicas_at_a_kill_are_read_from_the_minute_before_it():
    from apps.scaler.readings import replicas_at

    points = [
        {"t": 100, "replicas": 2},
        {"t": 150, "replicas": 4},
        {"t": 170, "replicas": 3},
        {"t": 300, "replicas": 3},
    ]
    assert replicas_at(points, [175]) == 4
    assert replicas_at(points, [175, 310]) == 3
    assert replicas_at(points, [1000]) is None
