"""The wizard's computed values: from measured memory and load, with edge cases."""

from __future__ import annotations

from datetime import UTC, datetime, timezone

from apps.calibration.curve import Curve
from apps.incidents.oom import ReplicaMemory, replica_memory
from apps.remediation import sizing
from tests.conftest import ray_fixture

MIB, GIB = 2**20, 2**30


def current(**overrides) -> sizing.Current:
    base = {"max_ongoing_requests": 8, "max_queued_requests": -1, "autoscaling": {"min_replicas": 1, "max_replicas": 2,
            "target_ongoing_requests": 4, "downscale_delay_s": 600}, "num_replicas": None, "ray_version": "2.60.0"}
    return sizing.Current(**(base | overrides))


def memory(baseline_mib: int, per_request_mib: int) -> sizing.Memory:
    return sizing.Memory(baseline_mib * MIB, per_request_mib * MIB, "calibration", "measured")


def budget(mib: int, nodes: int = 1) -> sizing.Budget:
    return sizing.Budget(mib * MIB, nodes, "budget")


def kill_message() -> str:
    actors = ray_fixture("state_actors_dead_oom_t1_modelonly_detail.json")["data"]["result"]["result"]
    return next(a["death_cause"]["oom_context"]["error_message"] for a in actors if (a.get("death_cause") or {}).get("oom_context"))


def test_the_kill_message_lists_the_killed_replica_and_its_peers_in_gib():
    listed = replica_memory(kill_message())
    killed = [r for r in listed if r.killed]
    assert [(r.application, r.deployment, r.replica) for r in killed] == [("modelonly", "Model", "lg45rpy4")]
    assert killed[0].used_bytes == int(5.48 * GIB)
    assert {(r.application, r.deployment) for r in listed if not r.killed} == {("demo", "Echo"), ("demo", "Model")}


def test_memory_from_a_kill_divides_by_the_measured_in_flight_and_never_guesses_it():
    listed = [ReplicaMemory("a", "M", "r1", 4200 * MIB, True), ReplicaMemory("a", "M", "r2", 200 * MIB, False)]
    measured = sizing.memory_from_kill(listed, "a", "M", in_flight=4, cap=8)
    assert (measured.baseline_bytes, measured.per_request_bytes) == (200 * MIB, 1000 * MIB)
    assert "4 requests in flight" in measured.reason
    # More in flight than the cap allows is a measurement artefact: the cap bounds it.
    assert sizing.memory_from_kill(listed, "a", "M", in_flight=20, cap=8).per_request_bytes == 500 * MIB
    assert sizing.memory_from_kill(listed, "a", "M", in_flight=None, cap=8) is None
    assert sizing.memory_from_kill(listed, "other", "M", in_flight=4, cap=8) is None


def test_without_an_idle_peer_the_baseline_is_zero_which_overstates_per_request_memory():
    alone = sizing.memory_from_kill([ReplicaMemory("a", "M", "r1", 800 * MIB, True)], "a", "M", in_flight=2, cap=8)
    assert (alone.baseline_bytes, alone.per_request_bytes) == (0, 400 * MIB) and "taken as 0" in alone.reason


def test_the_budget_is_the_kill_threshold_minus_everything_else_with_a_margin():
    listed = [ReplicaMemory("a", "M", "r1", 3 * GIB, True), ReplicaMemory("a", "M", "r2", 1 * GIB, False)]
    found = sizing.budget_from_kill(used_bytes=10 * GIB, threshold_bytes=9 * GIB, replicas=listed, app="a", dep="M", nodes=2)
    # Others used 10 - 4 = 6 GiB, so 3 GiB are left for this deployment, 80 % of it budgeted.
    assert found.bytes_per_node == int(3 * GIB * 0.8) and found.nodes == 2
    assert sizing.budget_from_kill(used_bytes=None, threshold_bytes=9 * GIB, replicas=listed, app="a", dep="M", nodes=1) is None
    assert sizing.budget_from_kill(used_bytes=20 * GIB, threshold_bytes=9 * GIB, replicas=listed, app="a", dep="M", nodes=1) is None


def test_node_headroom_is_the_budget_when_nothing_was_killed():
    found = sizing.budget_from_nodes([{"mem_total": 10 * GIB, "mem_used": 5 * GIB}, {"mem_total": 10 * GIB, "mem_used": 8 * GIB}])
    assert found.bytes_per_node == int((0.95 * 10 * GIB - 8 * GIB) * 0.8) and found.nodes == 2
    assert sizing.budget_from_nodes([]) is None
    assert sizing.budget_from_nodes([{"mem_total": 10 * GIB, "mem_used": 10 * GIB}]) is None


def test_one_request_per_replica_wins_when_it_serves_more_requests_within_the_budget():
    out = sizing.compute(current(), memory(200, 1000), budget(2500), sizing.Load(), latency_objective_ms=10_000)
    # c=1: 2 replicas of 1.2 GiB (2 in flight); c=2: 1 replica of 2.2 GiB (2 in flight): the tie goes to the lower peak.
    assert out.patch("R1")["max_ongoing_requests"] == 1
    assert out.patch("R2")["autoscaling_config"]["max_replicas"] == 2
    assert "2 such replica(s) fit" in out.values["R1"]["reasons"]["max_ongoing_requests"]
    assert not out.conservative


def test_two_at_once_when_the_baseline_dominates_and_two_serve_more():
    out = sizing.compute(current(), memory(2000, 100), budget(4500), sizing.Load(), latency_objective_ms=10_000)
    # c=1: 2 replicas × 1 = 2 in flight; c=2: 2 replicas × 2 = 4.
    assert out.patch("R1")["max_ongoing_requests"] == 2


def test_a_request_bigger_than_the_budget_is_said_plainly():
    out = sizing.compute(current(), memory(200, 4000), budget(2000), sizing.Load(), latency_objective_ms=10_000)
    assert out.patch("R1")["max_ongoing_requests"] == 1
    assert "lowering concurrency cannot prevent the kill" in out.values["R1"]["warnings"][0]


def test_without_measurements_the_values_are_conservative_and_say_why():
    out = sizing.compute(current(max_ongoing_requests=8), None, budget(2000), sizing.Load(), latency_objective_ms=10_000)
    assert out.conservative and out.patch("R1")["max_ongoing_requests"] == 1
    assert "run a calibration" in out.values["R1"]["reasons"]["max_ongoing_requests"]
    # No budget: the current maximum is kept rather than invented.
    assert out.patch("R2")["autoscaling_config"]["max_replicas"] == 2
    # Not even a busy moment raises it: more replicas of unknown size could be what kills the node.
    busy = sizing.compute(current(), None, budget(2000), sizing.Load(peak_in_flight=12), latency_objective_ms=10_000)
    assert busy.patch("R2")["autoscaling_config"]["max_replicas"] == 2
    assert "raise max_replicas once a calibration" in busy.values["R2"]["warnings"][0]


def test_autoscaling_bounds_follow_the_observed_peak_and_memory():
    load = sizing.Load(peak_in_flight=3, p50_ms=200)
    out = sizing.compute(current(), memory(100, 100), budget(5000), load, latency_objective_ms=10_000)
    auto = out.patch("R2")["autoscaling_config"]
    # Memory holds 25 replicas at c=1, the peak needed 3: twice that is plenty.
    assert auto == {"min_replicas": 2, "max_replicas": 6, "target_ongoing_requests": 1, "upscale_delay_s": 5, "downscale_delay_s": 600}
    busy = sizing.compute(current(), memory(100, 900), budget(2000), sizing.Load(peak_in_flight=12), latency_objective_ms=10_000)
    assert busy.patch("R2")["autoscaling_config"]["max_replicas"] == 2
    assert "12 requests in flight or queued" in busy.values["R2"]["warnings"][0]


def test_cold_starts_lengthen_the_downscale_delay():
    load = sizing.Load(cold_starts=True)
    out = sizing.compute(current(autoscaling=None, num_replicas=1), memory(100, 100), budget(1000), load, latency_objective_ms=10_000)
    assert out.patch("R2")["autoscaling_config"]["downscale_delay_s"] == 300


def test_the_queue_bound_comes_from_throughput_and_the_latency_objective():
    out = sizing.compute(current(), memory(100, 400), budget(1000), sizing.Load(p50_ms=500), latency_objective_ms=5_000)
    # 2 replicas × 1 slot at 0.5 s each: 4 requests/s; 5 s of that is 20, minus the 2 in service.
    assert out.patch("R10") == {"max_queued_requests": 18}
    fallback = sizing.compute(current(), memory(100, 400), budget(1000), sizing.Load(), latency_objective_ms=5_000)
    assert fallback.patch("R10") == {"max_queued_requests": 4} and "no latency measurement" in fallback.values["R10"]["reasons"]["max_queued_requests"]


def test_a_queue_bound_does_not_exist_before_ray_2_10():
    out = sizing.compute(current(ray_version="2.9.3"), memory(100, 400), budget(1000), sizing.Load(), latency_objective_ms=5_000)
    assert out.values["R10"]["not_applicable"] and out.patch("R10") is None
    assert "from Ray 2.10" in out.values["R10"]["warnings"][0]


def test_an_already_lower_concurrency_is_kept():
    out = sizing.compute(current(max_ongoing_requests=1), memory(100, 100), budget(5000), sizing.Load(), latency_objective_ms=5_000)
    assert out.patch("R1")["max_ongoing_requests"] == 1


def curve(axis: str, points: list[tuple[float, int]], baseline: int) -> Curve:
    return Curve(axis=axis, device="cpu", baseline_bytes=baseline, points=points, measured_at=datetime(2026, 11, 30, tzinfo=UTC),
                 calibration_id=7)


def test_memory_from_a_concurrency_curve_takes_the_steepest_step():
    found = sizing.memory_from_curve(curve("concurrency", [(1, 300 * MIB), (2, 450 * MIB), (4, 900 * MIB)], 200 * MIB))
    assert found.baseline_bytes == 200 * MIB and found.per_request_bytes == 225 * MIB and found.source == "calibration"
    assert "Calibration #7" in found.reason
    assert sizing.memory_from_curve(None) is None


def test_memory_from_a_token_curve_scales_per_token_by_the_request_size():
    tokens = curve("token_sum", [(64, 100 * MIB + 64 * 1024), (128, 100 * MIB + 128 * 1024)], 100 * MIB)
    assert sizing.memory_from_curve(tokens, tokens_per_request=512).per_request_bytes == 512 * 1024
    # Without a known request size, the largest calibrated batch is assumed.
    assert sizing.memory_from_curve(tokens).per_request_bytes == 128 * 1024


def test_load_comes_from_the_signal_points():
    points = [{"t": 1, "ongoing": 2, "queued": 1, "p50": 100, "rps": 3}, {"t": 2, "ongoing": 5, "queued": 4, "p50": 300, "starts": 1},
              {"t": 3, "ongoing": 1, "queued": 0, "p50": 120, "rps": 5}]
    load = sizing.load_from_points(points)
    assert (load.peak_in_flight, load.p50_ms, load.peak_rps, load.cold_starts) == (9, 120, 5, True)
    assert sizing.load_from_points([]) == sizing.Load()


def test_lowering_the_cap_below_the_autoscaling_target_lowers_the_target_too():
    out = sizing.compute(current(), memory(100, 100), budget(5000), sizing.Load(), latency_objective_ms=5_000)
    assert out.patch("R1")["autoscaling_config"] == {"target_ongoing_requests": 1}
    assert "would never be reached" in out.values["R1"]["reasons"]["target_ongoing_requests"]
    low_target = current(autoscaling={"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 1})
    assert "autoscaling_config" not in sizing.compute(low_target, memory(100, 100), budget(5000), sizing.Load(),
                                                      latency_objective_ms=5_000).patch("R1")
