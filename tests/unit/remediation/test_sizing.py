"""The wizard's computed values: from measured memory and load, with edge cases."""

from __future__ import annotations

from datetime import UTC, datetime

from apps.calibration.curve import Curve
from apps.incidents.oom import ReplicaMemory, replica_memory
from apps.remediation import measurements, schedulable, sizing, token_caps
from tests.conftest import ray_fixture

MIB, GIB = 2**20, 2**30


def current(**overrides) -> sizing.Current:
    base = {
        "max_ongoing_requests": 8,
        "max_queued_requests": -1,
        "autoscaling": {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 4, "downscale_delay_s": 600},
        "num_replicas": None,
        "ray_version": "2.60.0",
    }
    return sizing.Current(**(base | overrides))


def memory(baseline_mib: int, per_request_mib: int) -> measurements.Memory:
    return measurements.Memory(baseline_mib * MIB, per_request_mib * MIB, "calibration", "measured")


def budget(mib: int, nodes: int = 1) -> measurements.Budget:
    return measurements.Budget(mib * MIB, nodes, "budget")


def kill_message() -> str:
    actors = ray_fixture("state_actors_dead_oom_t1_modelonly_detail.json")["data"]["result"]["result"]
    return next(
        a["death_cause"]["oom_context"]["error_message"]
        for a in actors
        if (a.get("death_cause") or {}).get("oom_context")
    )


def test_the_kill_message_lists_the_killed_replica_and_its_peers_in_gib():
    listed = replica_memory(kill_message())
    killed = [r for r in listed if r.killed]
    assert [(r.application, r.deployment, r.replica) for r in killed] == [("modelonly", "Model", "lg45rpy4")]
    assert killed[0].used_bytes == int(5.48 * GIB)
    assert {(r.application, r.deployment) for r in listed if not r.killed} == {("demo", "Echo"), ("demo", "Model")}


def measured(
    baseline_mib: int, per_request_mib: int, service_s=(1.0, 1.0, 1.0), levels=(1, 2, 4)
) -> measurements.Memory:
    """Memory from a concurrency calibration that measured these levels and service times."""
    found = Curve(
        axis="concurrency",
        device="cpu",
        baseline_bytes=baseline_mib * MIB,
        points=[(k, (baseline_mib + k * per_request_mib) * MIB) for k in levels],
        measured_at=datetime(2026, 11, 30, tzinfo=UTC),
        calibration_id=9,
        service_s=dict(zip(map(float, levels), service_s, strict=True)),
    )
    return measurements.memory_from_curve(found)


def cpus(per_replica: float, total: float, held_by_others: float = 0.0) -> schedulable.Resources:
    return schedulable.resources_from(
        {"ray_actor_options": {"num_cpus": per_replica}},
        [{"CPU": total, "memory": 24 * GIB}],
        [({"num_cpus": held_by_others}, 1)] if held_by_others else [],
    )


def test_memory_from_a_kill_is_only_a_lower_bound_because_admitted_is_not_resident():
    listed = [ReplicaMemory("a", "M", "r1", 4200 * MIB, True), ReplicaMemory("a", "M", "r2", 200 * MIB, False)]
    bound = measurements.memory_from_kill(listed, "a", "M", in_flight=4, cap=8)
    assert bound.lower_bound and (bound.baseline_bytes, bound.per_request_bytes) == (200 * MIB, 1000 * MIB)
    assert bound.reason.startswith("Lower bound only") and "not requests resident" in bound.reason
    # No in-flight reading: spread over the cap, the most it could have held, which is still only a bound.
    assert measurements.memory_from_kill(listed, "a", "M", in_flight=None, cap=8).per_request_bytes == 500 * MIB
    assert measurements.memory_from_kill(listed, "other", "M", in_flight=4, cap=8) is None
    alone = measurements.memory_from_kill(
        [ReplicaMemory("a", "M", "r1", 800 * MIB, True)], "a", "M", in_flight=2, cap=8
    )
    assert alone.lower_bound and "size at rest is unknown" in alone.reason


def test_the_issue_s_kill_estimate_can_no_longer_allow_nine_replicas_on_a_one_gib_budget():
    # The run the estimate got wrong: 16 requests admitted, one resident at a time; really 520 MiB per request on a
    # 440 MiB replica.
    killed = [ReplicaMemory("a", "M", "r1", 440 * MIB + 16 * 113 * MIB, True)]
    bound = measurements.memory_from_kill(killed, "a", "M", in_flight=16, cap=16)
    out = sizing.compute(current(), bound, budget(1024), measurements.Load(), latency_objective_ms=10_000)
    assert out.needs_calibration and all(out.patch(r) is None for r in ("R1", "R2", "R10"))
    assert "run the calibration step first" in out.values["R1"]["reasons"]["max_ongoing_requests"]
    # What the calibration then measures sizes it: one replica of 960 MiB at a time fits 1 GiB, two do not.
    calibrated = sizing.compute(
        current(), measured(440, 520), budget(1024), measurements.Load(), latency_objective_ms=10_000
    )
    assert calibrated.patch("R1")["max_ongoing_requests"] == 1
    assert calibrated.patch("R2")["autoscaling_config"]["max_replicas"] == 1


def test_nothing_is_computed_without_a_measurement_or_a_budget():
    missing = sizing.compute(
        current(max_ongoing_requests=8),
        None,
        budget(2000),
        measurements.Load(peak_in_flight=12),
        latency_objective_ms=10_000,
    )
    assert missing.needs_calibration and missing.conservative and missing.plan is None
    assert all(missing.values[r]["patch"] is None and missing.values[r]["waiting"] for r in ("R1", "R2", "R10"))
    no_budget = sizing.compute(current(), measured(200, 400), None, measurements.Load(), latency_objective_ms=10_000)
    assert (
        not no_budget.needs_calibration
        and no_budget.patch("R1") is None
        and "no memory budget" in no_budget.why_not_sized
    )


def test_a_baseline_the_job_understated_is_lifted_to_what_a_real_replica_used():
    found = Curve(
        axis="concurrency",
        device="cpu",
        baseline_bytes=100 * MIB,
        points=[(1, 620 * MIB), (2, 1140 * MIB)],
        measured_at=datetime(2026, 11, 30, tzinfo=UTC),
        calibration_id=3,
        service_s={1.0: 1.0, 2.0: 1.0},
    )
    peers = [ReplicaMemory("a", "M", "r1", 3 * GIB, True), ReplicaMemory("a", "M", "r2", 440 * MIB, False)]
    floor, why = measurements.replica_floor_from_kill(peers, "a", "M")
    memory_found = measurements.memory_from_curve(found, replica_floor_bytes=floor, floor_reason=why)
    assert (
        memory_found.baseline_bytes == 440 * MIB
        and memory_found.peak(1) == 960 * MIB
        and memory_found.peak(2) == 1480 * MIB
    )
    assert "lifted" in memory_found.reason
    out = sizing.compute(current(), memory_found, budget(1024), measurements.Load(), latency_objective_ms=10_000)
    assert out.patch("R2")["autoscaling_config"]["max_replicas"] == 1


def test_no_replica_is_left_unschedulable():
    # The issue's cluster: replicas of 0.5 CPU on 2 CPUs. Memory would hold 20; the CPUs schedule 4.
    out = sizing.compute(
        current(),
        measured(100, 100),
        budget(10_000),
        measurements.Load(),
        latency_objective_ms=10_000,
        resources=cpus(0.5, 2.0),
    )
    assert out.plan["binding"] == "CPU" and out.patch("R2")["autoscaling_config"]["max_replicas"] == 4
    assert "schedules 2 CPU at 0.5 each" in out.values["R2"]["reasons"]["max_replicas"]
    # What the other deployments hold is not there to take.
    held = sizing.compute(
        current(),
        measured(100, 100),
        budget(10_000),
        measurements.Load(),
        latency_objective_ms=10_000,
        resources=cpus(0.5, 2.0, held_by_others=1.0),
    )
    assert held.patch("R2")["autoscaling_config"]["max_replicas"] == 2
    gpu = schedulable.resources_from({"ray_actor_options": {"num_cpus": 1, "num_gpus": 1}}, [{"CPU": 16, "GPU": 2}], [])
    assert gpu.replicas() == (2, "GPU")
    # Serve's default when nothing is named is 1 CPU.
    assert schedulable.resources_from({}, [{"CPU": 2}], []).per_replica == {"CPU": 1.0}


def test_the_concurrency_that_serves_most_requests_wins_from_measured_service_times():
    # Two replicas fit either way; at 2 at once an I/O-bound request takes as long as alone, so twice the goodput.
    io_bound = sizing.compute(
        current(),
        measured(2000, 100, levels=(1, 2), service_s=(1.0, 1.0)),
        budget(4500),
        measurements.Load(),
        latency_objective_ms=10_000,
    )
    assert io_bound.patch("R1")["max_ongoing_requests"] == 2 and io_bound.plan["throughput_rps"] == 4.0
    # CPU-bound: two at once take twice as long, no more goodput, a higher peak: one at a time.
    cpu_bound = sizing.compute(
        current(),
        measured(2000, 100, levels=(1, 2), service_s=(1.0, 2.0)),
        budget(4500),
        measurements.Load(),
        latency_objective_ms=10_000,
    )
    assert cpu_bound.patch("R1")["max_ongoing_requests"] == 1
    assert "Weighed: 1 at once: 2 replica(s)" in cpu_bound.values["R1"]["reasons"]["max_ongoing_requests"]


def test_a_near_tie_goes_to_more_replicas_then_to_the_lower_peak():
    # The plain app on the bench: 1.59 against 1.61 requests/s is noise; two replicas survive the loss of one.
    out = sizing.compute(
        current(),
        measured(183, 256, service_s=(2.17, 2.52, 2.48)),
        budget(1704),
        measurements.Load(),
        latency_objective_ms=10_000,
    )
    assert [c["replicas"] for c in out.plan["candidates"]] == [3, 2, 1]
    assert out.patch("R1")["max_ongoing_requests"] == 2 and out.patch("R2")["autoscaling_config"]["min_replicas"] == 2


def test_only_measured_concurrencies_are_chosen_and_a_slow_one_is_excluded():
    out = sizing.compute(
        current(),
        measured(100, 50, levels=(1, 2, 4), service_s=(1.0, 1.0, 12.0)),
        budget(3000),
        measurements.Load(),
        latency_objective_ms=10_000,
    )
    assert [c["concurrency"] for c in out.plan["candidates"]] == [1, 2, 4]
    assert out.plan["candidates"][2]["too_slow"] and out.patch("R1")["max_ongoing_requests"] == 2


def test_the_same_measurements_always_give_the_same_values_whatever_the_load_did_after():
    args = (current(), measured(300, 200), budget(3000))
    quiet = sizing.compute(*args, measurements.Load(peak_in_flight=3, p50_ms=4000), latency_objective_ms=10_000)
    busy = sizing.compute(
        *args, measurements.Load(peak_in_flight=40, p50_ms=9000, cold_starts=True), latency_objective_ms=10_000
    )
    assert {r: quiet.patch(r) for r in ("R1", "R2", "R10")} == {r: busy.patch(r) for r in ("R1", "R2", "R10")}
    # The busy incident is told what serving it would take, and still gets the best safe config.
    warning = busy.values["R2"]["warnings"][0]
    assert (
        "40 requests in flight or queued" in warning
        and "more replica(s): about" in warning
        and "more memory" in warning
    )


def test_the_queue_bound_comes_from_the_measured_service_time_not_a_queued_p50():
    out = sizing.compute(
        current(),
        measured(100, 400, levels=(1,), service_s=(0.5,)),
        budget(1000),
        measurements.Load(p50_ms=4000),
        latency_objective_ms=5_000,
    )
    # 2 replicas × 1 slot at 0.5 s each: 4 requests/s; 80 % of 5 s less the 0.5 s of service is 3.5 s of waiting:
    # 14 queued.
    assert out.patch("R10") == {"max_queued_requests": 14}
    assert "0.50 s per request (measured by the calibration)" in out.values["R10"]["reasons"]["max_queued_requests"]
    unmeasured = sizing.compute(
        current(), memory(100, 400), budget(1000), measurements.Load(), latency_objective_ms=5_000
    )
    assert unmeasured.patch("R10") == {"max_queued_requests": 4}


def test_a_load_past_what_the_replicas_and_their_queue_hold_is_said_with_what_would_serve_it():
    # The plain app on the bench: 2 replicas × 2 at 2.13 s, a 10 s objective, 32 requests at once at the incident.
    memory_found = measured(183, 256, service_s=(2.17, 2.13, 2.48))
    out = sizing.compute(
        current(), memory_found, budget(1633), measurements.Load(peak_in_flight=32), latency_objective_ms=10_000
    )
    plan, bound = out.plan, out.patch("R10")["max_queued_requests"]
    assert (plan["replicas"], plan["concurrency"], bound) == (2, 2, 11)
    [warning] = out.values["R10"]["warnings"]
    assert (
        "32 requests were in flight or queued; 4 slots and a queue of 11 hold 15, so about 17 at once would be shed"
        in warning
    )
    assert "about 3 more replica(s) of 695 MiB" in warning
    # A load the slots and the queue hold draws no warning.
    assert (
        sizing.compute(
            current(), memory_found, budget(1633), measurements.Load(peak_in_flight=15), latency_objective_ms=10_000
        ).values["R10"]["warnings"]
        == []
    )


def test_a_request_bigger_than_the_budget_is_said_plainly():
    out = sizing.compute(current(), memory(200, 4000), budget(2000), measurements.Load(), latency_objective_ms=10_000)
    assert out.patch("R1")["max_ongoing_requests"] == 1
    assert "no concurrency prevents the kill" in out.values["R1"]["warnings"][0]


def test_autoscaling_fills_the_memory_budget_and_keeps_two_warm():
    out = sizing.compute(
        current(), memory(100, 100), budget(5000), measurements.Load(peak_in_flight=3), latency_objective_ms=10_000
    )
    auto = out.patch("R2")["autoscaling_config"]
    # 1 or 2 at once (no service times: request slots count): 2 at once holds 16 replicas of 300 MiB, 32 slots.
    assert out.patch("R1")["max_ongoing_requests"] == 2
    assert auto == {
        "min_replicas": 2,
        "max_replicas": 16,
        "target_ongoing_requests": 1,
        "upscale_delay_s": 5,
        "downscale_delay_s": 600,
    }


def test_the_budget_is_the_kill_threshold_minus_everything_else_with_a_margin():
    listed = [ReplicaMemory("a", "M", "r1", 3 * GIB, True), ReplicaMemory("a", "M", "r2", 1 * GIB, False)]
    found = measurements.budget_from_kill(
        used_bytes=10 * GIB, threshold_bytes=9 * GIB, replicas=listed, app="a", dep="M", nodes=2
    )
    # Others used 10 - 4 = 6 GiB, so 3 GiB are left for this deployment, 80 % of it budgeted.
    assert found.bytes_per_node == int(3 * GIB * 0.8) and found.nodes == 2
    assert (
        measurements.budget_from_kill(
            used_bytes=None, threshold_bytes=9 * GIB, replicas=listed, app="a", dep="M", nodes=1
        )
        is None
    )
    assert (
        measurements.budget_from_kill(
            used_bytes=20 * GIB, threshold_bytes=9 * GIB, replicas=listed, app="a", dep="M", nodes=1
        )
        is None
    )


def test_node_headroom_is_the_budget_when_nothing_was_killed():
    found = measurements.budget_from_nodes(
        [{"mem_total": 10 * GIB, "mem_used": 5 * GIB}, {"mem_total": 10 * GIB, "mem_used": 8 * GIB}]
    )
    assert found.bytes_per_node == int((0.95 * 10 * GIB - 8 * GIB) * 0.8) and found.nodes == 2
    assert measurements.budget_from_nodes([]) is None
    assert measurements.budget_from_nodes([{"mem_total": 10 * GIB, "mem_used": 10 * GIB}]) is None


def test_one_request_per_replica_wins_when_it_serves_more_requests_within_the_budget():
    out = sizing.compute(current(), memory(200, 1000), budget(2500), measurements.Load(), latency_objective_ms=10_000)
    # c=1: 2 replicas of 1.2 GiB (2 in flight); c=2: 1 replica of 2.2 GiB (2 in flight): the tie goes to the lower peak.
    assert out.patch("R1")["max_ongoing_requests"] == 1
    assert out.patch("R2")["autoscaling_config"]["max_replicas"] == 2
    assert "2 such replica(s) fit" in out.values["R1"]["reasons"]["max_ongoing_requests"]
    assert not out.conservative


def test_two_at_once_when_the_baseline_dominates_and_two_serve_more():
    out = sizing.compute(current(), memory(2000, 100), budget(4500), measurements.Load(), latency_objective_ms=10_000)
    # c=1: 2 replicas × 1 = 2 in flight; c=2: 2 replicas × 2 = 4.
    assert out.patch("R1")["max_ongoing_requests"] == 2


def test_cold_starts_lengthen_the_downscale_delay():
    load = measurements.Load(cold_starts=True)
    out = sizing.compute(
        current(autoscaling=None, num_replicas=1), memory(100, 100), budget(1000), load, latency_objective_ms=10_000
    )
    assert out.patch("R2")["autoscaling_config"]["downscale_delay_s"] == 300


def test_a_queue_bound_does_not_exist_before_ray_2_10():
    out = sizing.compute(
        current(ray_version="2.9.3"), memory(100, 400), budget(1000), measurements.Load(), latency_objective_ms=5_000
    )
    assert out.values["R10"]["not_applicable"] and out.patch("R10") is None
    assert "from Ray 2.10" in out.values["R10"]["warnings"][0]


def curve(axis: str, points: list[tuple[float, int]], baseline: int) -> Curve:
    return Curve(
        axis=axis,
        device="cpu",
        baseline_bytes=baseline,
        points=points,
        measured_at=datetime(2026, 11, 30, tzinfo=UTC),
        calibration_id=7,
    )


def test_memory_from_a_concurrency_curve_takes_the_steepest_step():
    found = measurements.memory_from_curve(
        curve("concurrency", [(1, 300 * MIB), (2, 450 * MIB), (4, 900 * MIB)], 200 * MIB)
    )
    assert found.baseline_bytes == 200 * MIB and found.per_request_bytes == 225 * MIB and found.source == "calibration"
    assert "Calibration #7" in found.reason
    assert measurements.memory_from_curve(None) is None


def test_memory_from_a_token_curve_scales_per_token_by_the_request_size():
    tokens = curve("token_sum", [(64, 100 * MIB + 64 * 1024), (128, 100 * MIB + 128 * 1024)], 100 * MIB)
    assert measurements.memory_from_curve(tokens, tokens_per_request=512).per_request_bytes == 512 * 1024
    # Without a known request size, the largest calibrated batch is assumed.
    assert measurements.memory_from_curve(tokens).per_request_bytes == 128 * 1024


def test_load_comes_from_the_signal_points():
    points = [
        {"t": 1, "ongoing": 2, "queued": 1, "p50": 100, "rps": 3},
        {"t": 2, "ongoing": 5, "queued": 4, "p50": 300, "starts": 1},
        {"t": 3, "ongoing": 1, "queued": 0, "p50": 120, "rps": 5},
    ]
    load = measurements.load_from_points(points)
    assert (load.peak_in_flight, load.p50_ms, load.peak_rps, load.cold_starts) == (9, 120, 5, True)
    assert measurements.load_from_points([]) == measurements.Load()


def test_lowering_the_cap_below_the_autoscaling_target_lowers_the_target_too():
    out = sizing.compute(current(), memory(100, 100), budget(5000), measurements.Load(), latency_objective_ms=5_000)
    assert out.patch("R1")["autoscaling_config"] == {"target_ongoing_requests": 1}
    assert "would never be reached" in out.values["R1"]["reasons"]["target_ongoing_requests"]
    low_target = current(autoscaling={"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 1})
    assert "autoscaling_config" not in sizing.compute(
        low_target, memory(100, 100), budget(5000), measurements.Load(), latency_objective_ms=5_000
    ).patch("R1")


# --- token-sum calibrations and R4 ------------------------------------------------------------


KIB = 2**10
CAPS = {"max_prompt_tokens": 512, "max_tokens_cap": 128}


def token_curve(per_token_kib: int = 64, baseline_mib: int = 100, sums=(256, 1024)) -> Curve:
    return curve("token_sum", [(n, baseline_mib * MIB + n * per_token_kib * KIB) for n in sums], baseline_mib * MIB)


def test_a_request_brings_the_tokens_its_caps_allow_or_none_is_known():
    assert token_caps.request_tokens(CAPS) == (
        640,
        "a request brings at most 640 tokens (user_config max_prompt_tokens 512 + max_tokens_cap 128)",
    )
    tokens, reason = token_caps.request_tokens({"max_prompt_tokens": 512, "max_tokens_cap": None})
    assert tokens is None and reason == "the user_config caps no max_tokens_cap"
    assert token_caps.request_tokens({"max_prompt_tokens": True, "max_tokens_cap": 0})[1] == (
        "the user_config caps no max_prompt_tokens and no max_tokens_cap"
    )
    assert token_caps.request_tokens(None)[0] is None


def test_memory_from_a_token_curve_says_where_the_request_size_comes_from():
    capped = measurements.memory_from_curve(token_curve(), *token_caps.request_tokens(CAPS))
    assert capped.per_request_bytes == 640 * 64 * KIB and "max_prompt_tokens 512 + max_tokens_cap 128" in capped.reason
    uncapped = measurements.memory_from_curve(token_curve(), *token_caps.request_tokens({}))
    assert uncapped.per_request_bytes == 1024 * 64 * KIB
    assert (
        "caps no max_prompt_tokens and no max_tokens_cap, so a request is taken to be as large as the largest "
        "calibrated batch, 1024 tokens (conservative)" in uncapped.reason
    )
    # A concurrency curve has no tokens to price: the caps change nothing.
    assert (
        measurements.memory_from_curve(curve("concurrency", [(1, 300 * MIB)], 200 * MIB), 640, "x").per_request_bytes
        == 100 * MIB
    )


def r4(user_config: dict | None, token: Curve, found_budget: measurements.Budget | None, **overrides) -> dict:
    now = current(user_config=user_config, **overrides)
    memory_found = measurements.memory_from_curve(token, *token_caps.request_tokens(user_config))
    return sizing.compute(
        now, memory_found, found_budget, measurements.Load(), latency_objective_ms=10_000, curve=token
    ).values


def test_the_batch_limit_is_the_largest_sum_whose_peak_fits_one_replica_s_share_of_the_budget():
    token = token_curve()
    values = r4({**CAPS, "max_batch_tokens": 4096, "scratch_kb_per_token": 64}, token, budget(2000))
    # A 640-token request costs 40 MiB: c=1 fits 14 replicas of 140 MiB, c=2 11 of 180 MiB, so 2 at once and 11 per
    # node.
    assert values["R1"]["patch"]["max_ongoing_requests"] == 2 and values["R1"]["replicas_per_node"] == 11
    share = 2000 * MIB // 11
    limit = values["R4"]["value"]["max_batch_tokens"]
    assert token.peak_at(limit) <= share < token.peak_at(limit + 1) and limit == 1309
    # Serve replaces user_config wholesale; the planner merges this into the running one, keeping the other keys.
    assert values["R4"]["patch"] == {"user_config": {"max_batch_tokens": 1309}}
    reason = values["R4"]["reasons"]["max_batch_tokens"]
    assert (
        reason.startswith("1309: a batch of 1309 tokens peaks at about 182 MiB")
        and "2,000 MiB per node ÷ 11 replica(s)" in reason
    )
    assert "max_ongoing_requests 2" in reason and "safety margin is already in the budget" in reason
    assert values["R4"]["warnings"] == [
        "1309 tokens is beyond the largest calibrated sum (1024): the curve's last step is "
        "extrapolated. Calibrate up to 1309 tokens to confirm it."
    ]


def test_without_a_max_batch_tokens_key_the_limit_is_guidance_not_a_patch():
    values = r4(dict(CAPS), token_curve(), budget(2000))
    assert values["R4"]["patch"] is None and values["R4"]["value"] == {"max_batch_tokens": 1309}


def test_a_lower_batch_limit_is_kept_and_an_unbounded_one_is_bounded():
    kept = r4({**CAPS, "max_batch_tokens": 512}, token_curve(), budget(2000))["R4"]
    assert kept["patch"] == {"user_config": {"max_batch_tokens": 512}} and kept["largest_fitting_tokens"] == 1309
    assert kept["reasons"]["max_batch_tokens"].endswith("It is already 512, lower than computed: kept.")
    assert kept["warnings"][0].startswith("One request may bring 640 tokens (its caps) but a batch holds at most 512")
    unbounded = r4({**CAPS, "max_batch_tokens": None}, token_curve(), budget(2000))["R4"]
    assert unbounded["patch"] == {"user_config": {"max_batch_tokens": 1309}}


def test_requests_larger_than_the_fitting_batch_are_called_out():
    # 1 MiB per token: a 640-token request alone (740 MiB) is more than the 500 MiB budget.
    values = r4({**CAPS, "max_batch_tokens": 4096}, token_curve(per_token_kib=1024), budget(500))
    assert values["R1"]["replicas_per_node"] == 1
    assert values["R4"]["value"] == {"max_batch_tokens": 400} and values["R4"]["patch"] == {
        "user_config": {"max_batch_tokens": 400}
    }
    assert (
        "One request may bring 640 tokens (its caps) but a batch holds at most 400: larger requests would be refused"
        in values["R4"]["warnings"][0]
    )


def test_no_batch_fits_when_the_replica_at_rest_exceeds_its_share():
    values = r4({**CAPS, "max_batch_tokens": 1024}, token_curve(baseline_mib=900), budget(800))
    assert values["R4"]["patch"] is None and values["R4"]["value"] == {"max_batch_tokens": None}
    assert "already needs more than its share" in values["R4"]["warnings"][0]
    assert values["R4"]["reasons"]["max_batch_tokens"].startswith("Not computed:")


def test_without_a_budget_the_batch_limit_is_not_computed_and_says_why():
    values = r4({**CAPS, "max_batch_tokens": 1024}, token_curve(), None)
    assert values["R4"]["patch"] is None and "no memory budget" in values["R4"]["reasons"]["max_batch_tokens"]


def test_a_flat_curve_is_not_extrapolated_past_four_times_the_largest_calibrated_sum():
    flat = curve("token_sum", [(256, 200 * MIB), (1024, 200 * MIB)], 100 * MIB)
    values = r4({**CAPS, "max_batch_tokens": 100_000}, flat, budget(10_000))
    assert values["R4"]["value"] == {"max_batch_tokens": 4096}
    assert "Capped at 4 × the largest calibrated sum (1024)" in values["R4"]["reasons"]["max_batch_tokens"]
    assert not any("beyond the largest calibrated sum" in w for w in values["R4"]["warnings"])


def test_a_dip_in_the_measured_curve_never_counts_as_room():
    dipping = curve("token_sum", [(256, 300 * MIB), (1024, 200 * MIB)], 100 * MIB)
    # The rise to 300 MiB at 256 tokens crosses 250 MiB at 192; the lower peak measured at 1024 does not make 1024 fit.
    assert token_caps.largest_token_sum(dipping, 250 * MIB, 4096) == 192
    assert token_caps.largest_token_sum(dipping, 99 * MIB, 4096) == 0
    assert token_caps.largest_token_sum(dipping, 10_000 * MIB, 4096) == 4096


def test_a_concurrency_curve_leaves_r4_without_a_computed_value():
    concurrency = curve("concurrency", [(1, 300 * MIB), (2, 400 * MIB)], 200 * MIB)
    out = sizing.compute(
        current(user_config=CAPS),
        measurements.memory_from_curve(concurrency),
        budget(2000),
        measurements.Load(),
        latency_objective_ms=10_000,
        curve=concurrency,
    )
    assert "R4" not in out.values


def test_replicas_that_kept_memory_at_rest_are_told_to_recycle_after_the_in_place_change():
    # The outcome run: 318 MiB calibrated at rest, +522 MiB a request, 3,240 MiB for the node; after the
    # misbehaving config's bursts a replica at rest still held 4.4 GiB its allocator kept.
    args = (current(), measured(318, 522), budget(3240), measurements.Load())
    sized = sizing.compute(*args, latency_objective_ms=10_000)
    kept = sizing.compute(*args, latency_objective_ms=10_000, kept_bytes=4404 * MIB - 318 * MIB)
    assert kept.values["R1"]["patch"] == sized.values["R1"]["patch"]  # the values themselves do not move
    [warning] = [w for w in kept.values["R1"]["warnings"] if "kept" in w]
    assert "Recycle the replicas once the change is applied" in warning
    assert "up to 4,086 MiB more at rest" in warning and "peak at 5,448 MiB against the 1,620 MiB" in warning
    assert not [w for w in sized.values["R1"]["warnings"] if "kept" in w]
    # A few MiB above the calibration is Ray's sampling, not memory kept.
    noise = sizing.compute(*args, latency_objective_ms=10_000, kept_bytes=20 * MIB)
    assert not [w for w in noise.values["R1"]["warnings"] if "kept" in w]
