"""Memory measured passively, from what Ray already exports: per-process resident memory by
replica title, joined with the replicas' requests in flight, and what sizing may do with it."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx

from apps.calibration.curve import Curve
from apps.fleet import metric_readings
from apps.incidents import prometheus_readings
from apps.incidents.oom import ReplicaMemory
from apps.remediation import measurements, observed, sizing
from integrations import ray_metrics
from tests.conftest import FIXTURES

MIB = 2**20
MB = 1_000_000  # the unit of ray_component_rss_mb
KEY = ("reference", "Generator")


def scrape(name: str, at: float) -> ray_metrics.Scrape:
    return metric_readings.relevant(
        ray_metrics.parse((FIXTURES / f"metrics_component_memory_{name}.prom").read_text(), at=at)
    )


def point(name: str, at: float) -> dict:
    reading = metric_readings.read(scrape(name, at - 3), scrape(name, at))
    return metric_readings.point(at, reading.seconds, reading.deployments[KEY])


def test_a_replicas_memory_is_summed_over_the_titles_it_carries_at_rest_and_serving():
    busy = point("busy_one_replica", 100)
    # Captured serving 4 requests: its title then is "...Generator" and the serving one was reset to 0.
    assert (busy["rss_mb"], busy["replicas"], busy["ongoing"]) == (1872.9, 1, 4.0)
    idle = point("idle_one_replica", 200)
    assert (idle["rss_mb"], idle["replicas"], idle["ongoing"]) == (450.2, 1, 0.0)


def test_a_replicas_unique_memory_is_read_beside_its_resident_memory():
    # Its resident memory counts the ~235 MB of pages every Ray worker shares; its unique memory does not.
    assert point("busy_one_replica", 100)["uss_mb"] == 1637.4
    assert point("idle_one_replica", 200)["uss_mb"] == 214.5


def test_a_replica_still_starting_is_left_out_and_a_killed_ones_requests_do_not_make_memory():
    starting = point("replica_starting", 100)
    # The only memory is the new replica's __init__ (380 MiB); the killed one still reports 4 requests.
    assert starting["rss_mb"] == 0.0 and starting["ongoing"] == 4.0
    assert observed.from_points([starting]) is None


def test_the_title_of_one_deployment_never_counts_for_another():
    keys = [("a", "M"), ("a", "M.b"), ("ab", "M")]
    assert metric_readings.replica_deployment("ray::ServeReplica:a:M.handle_request_with_rejection", keys) == ("a", "M")
    assert metric_readings.replica_deployment("ray::ServeReplica:a:M.b", keys) == ("a", "M.b")
    assert metric_readings.replica_deployment("ray::ServeReplica:a:Mx", keys) is None
    assert metric_readings.replica_deployment("ray::ServeController", keys) is None
    assert metric_readings.replica_deployment("ray::SERVE_REPLICA::a#M#x1:ServeReplica:a:M.__init__", keys) is None


def test_traffic_gives_a_baseline_and_a_lower_bound_per_request():
    # Readings at rest count once the next export interval confirmed them: 100 by 115, 175 by 190;
    # busy ones inside a busy spell: 145, between 130 and 160.
    points = [
        point("idle_one_replica", 100),
        point("idle_one_replica", 115),
        point("busy_one_replica", 130),
        point("busy_one_replica", 145),
        point("busy_one_replica", 160),
        point("idle_one_replica", 175),
        point("idle_one_replica", 190),
    ]
    seen = observed.from_points(points)
    assert seen.baseline_bytes == 450.2 * MB
    # (1872.9 - 450.2) MB over 4 requests admitted.
    assert seen.per_request_bytes == int((1872.9 - 450.2) / 4 * MB)
    assert (seen.idle_readings, seen.busy_readings) == (2, 1) and "lower bound" in seen.reason.lower()


def test_a_replica_at_rest_after_a_burst_keeps_its_peaks_so_the_least_reading_at_rest_is_its_floor():
    # As on the reference app: 318 MiB at rest before the first burst; after 16 requests at once its
    # allocator kept 4.4 GiB, at rest too. The floor a baseline may be lifted to is the least; the
    # per-request lower bound still subtracts the largest, so it never grows from the kept memory.
    rest = {"replicas": 1, "ongoing": 0.0, "rps": 0.0}
    busy = {"replicas": 1, "ongoing": 16.0, "rps": 1.5}
    points = [
        {**rest, "t": 0, "rss_mb": 333.5},
        {**rest, "t": 12, "rss_mb": 333.5},
        {**busy, "t": 24, "rss_mb": 6000.0},
        {**busy, "t": 36, "rss_mb": 9000.0},
        {**busy, "t": 48, "rss_mb": 8000.0},
        {**rest, "t": 60, "rss_mb": 4617.5},
        {**rest, "t": 72, "rss_mb": 4617.5},
    ]
    seen = observed.from_points(points)
    # The newest reading waits for an export interval to confirm it.
    assert seen.idle_readings == 2
    assert seen.rest_floor_bytes == int(333.5 * MB) and seen.baseline_bytes == int(4617.5 * MB)
    assert seen.as_dict()["rest_floor_bytes"] == seen.rest_floor_bytes
    assert observed.from_points(points[2:5]).rest_floor_bytes is None


def test_memory_shown_before_its_requests_is_not_taken_for_a_replica_at_rest():
    # As read on a real cluster under a burst: the process memory moved a reading or two before the
    # requests gauge and counter, which trail it by up to an export interval.
    rest = {"replicas": 1, "ongoing": 0.0, "rps": 0.0}
    points = [
        {**rest, "t": 803, "rss_mb": 215.0},
        {**rest, "t": 808, "rss_mb": 689.8},
        {**rest, "t": 810, "rss_mb": 689.8},
        {"t": 812, "replicas": 1, "ongoing": 7.0, "rps": 0.45, "rss_mb": 2041.3},
    ]
    seen = observed.from_points(points)
    assert seen.idle_readings == 0 and seen.baseline_bytes == 215 * MB
    assert "no reading at rest" in seen.reason
    # The same memory, then an export interval of quiet readings after it: at rest after all.
    quiet = observed.from_points([*points[:3], {**rest, "t": 821, "rss_mb": 689.8}])
    assert quiet.idle_readings == 3 and quiet.baseline_bytes == int(689.8 * MB)


def test_requests_shown_after_their_memory_are_counted_with_it():
    # As read on a real cluster: the gauge showed one request while the memory held more; the
    # next readings, within an export interval, showed seven. Over one request, 616 MB a request
    # would have been reported "at least" for requests of 524 MB. The reading as the burst began is
    # not inside a busy spell; the next one is, and its memory is spread over the seven.
    rest = {"replicas": 1, "ongoing": 0.0, "rps": 0.0}
    points = [
        {**rest, "t": 790, "rss_mb": 216.0},
        {**rest, "t": 801, "rss_mb": 216.0},
        {"t": 806, "replicas": 1, "ongoing": 1.0, "rps": 0.0, "rss_mb": 832.0},
        {"t": 812, "replicas": 1, "ongoing": 7.0, "rps": 0.45, "rss_mb": 2041.3},
        {"t": 840, "replicas": 1, "ongoing": 7.0, "rps": 1.2, "rss_mb": 3600.0},
    ]
    seen = observed.from_points(points)
    assert seen.baseline_bytes == 216 * MB and seen.busy_readings == 1
    assert seen.per_request_bytes == int((2041.3 - 216.0) / 7 * MB) < 524 * MB
    # Readings farther apart than an export interval still lend their neighbours their requests.
    sparse = observed.from_points([{**p, "t": 30 * k} for k, p in enumerate(points)])
    assert sparse.per_request_bytes == seen.per_request_bytes


def test_a_gauge_that_understates_the_requests_in_flight_is_outweighed_by_its_spell():
    # Read off a real cluster (tests/integration/test_wizard_real_ray.py): 8 clients throughout,
    # requests of 500 MiB (524 MB). The gauge fell to 4 and 3 for 15 s while the memory held nearly
    # five requests and then six; spread over the most requests near it, 'at least 574 MiB' was
    # reported. Over the most its spell showed (8), the bound stays below the truth.
    rest = [{"t": t, "replicas": 1, "ongoing": 0.0, "rps": 0.0, "rss_mb": 227.0} for t in (6.7, 8.9, 11.0, 13.4, 22.0)]
    spell = [
        (26.5, 8, 2212.9), (29.0, 8, 1980.5), (33.6, 8, 2296.6), (35.8, 7, 2296.6), (40.5, 7, 1485.1),
        (44.9, 7, 2377.9), (47.2, 8, 2377.9), (54.0, 8, 1365.6), (56.3, 4, 1365.6), (60.9, 4, 1914.9),
        (65.5, 7, 1556.1), (70.3, 7, 1884.1), (77.4, 4, 1797.2), (79.6, 4, 2559.8), (84.2, 4, 2636.4),
        (86.4, 3, 2636.4), (88.7, 3, 2636.4), (91.8, 3, 3691.5),
    ]  # fmt: skip
    points = [*rest, *({"t": t, "replicas": 1, "ongoing": float(n), "rps": 0.0, "rss_mb": rss} for t, n, rss in spell)]
    seen = observed.from_points(points)
    assert seen.baseline_bytes == 227 * MB
    assert seen.per_request_bytes == int((2636.4 - 227.0) / 8 * MB) < 500 * MIB
    # A reading at rest (as at 65.5 s) ends a spell: the part after it keeps its own most (7).
    cut = [*points[:15], {**points[15], "ongoing": 0.0}, *points[16:]]
    assert observed.from_points(cut).per_request_bytes == int((2636.4 - 227.0) / 7 * MB)


def test_requests_served_between_readings_or_a_reading_too_recent_are_not_rest():
    served = {"t": 0, "replicas": 1, "ongoing": 0.0, "rps": 0.2, "rss_mb": 900.0}
    later = {"t": 30, "replicas": 1, "ongoing": 0.0, "rps": 0.0, "rss_mb": 400.0}
    seen = observed.from_points([served, later])
    # The first served requests; the second has no reading after it to confirm it.
    assert seen.idle_readings == 0 and seen.baseline_bytes == 400 * MB
    confirmed = observed.from_points([served, later, {**later, "t": 60, "rss_mb": 410.0}])
    assert confirmed.idle_readings == 1 and confirmed.baseline_bytes == 400 * MB


def test_a_killed_replicas_lingering_series_can_only_lower_the_bound():
    # Two live replicas at 450 MiB each and a third series left by a killed one: 901 MiB over 3.
    gone = point("idle_two_replicas_one_gone", 100)
    assert (gone["rss_mb"], gone["replicas"]) == (901.4, 3)
    busy = {**gone, "t": 110, "ongoing": 4.0, "rss_mb": 901.4 + 4 * 300}
    seen = observed.from_points([gone, busy, {**busy, "t": 120}, {**busy, "t": 130}])
    assert seen.per_request_bytes <= 300 * MB


def test_memory_sampled_before_the_requests_ended_is_spread_over_the_requests_just_before():
    eight = {"t": 5, "replicas": 1, "rss_mb": 400.0 + 8 * 100, "ongoing": 8.0}
    # Memory reported a few seconds late: still the eight requests' memory, with one request now in flight.
    late = {"t": 10, "replicas": 1, "rss_mb": 400.0 + 8 * 100, "ongoing": 1.0}
    one = {"t": 15, "replicas": 1, "rss_mb": 400.0 + 100, "ongoing": 1.0}
    rest = [{"t": t, "replicas": 1, "rss_mb": 400.0, "ongoing": 0.0, "rps": 0.0} for t in (-30, -15)]
    seen = observed.from_points([*rest, {**eight, "t": 0}, eight, late, one])
    assert seen.per_request_bytes == 100 * MB


def test_a_replaced_replica_or_a_burst_from_rest_gives_no_bound():
    rest = [{"t": t, "replicas": 1, "ongoing": 0.0, "rps": 0.0, "rss_mb": 400.0} for t in (-30, -15)]
    busy = {"replicas": 1, "ongoing": 4.0, "rps": 2.0, "rss_mb": 400.0 + 4 * 100}
    spell = [{**busy, "t": t} for t in (0, 5, 10, 15, 20)]
    assert observed.from_points([*rest, *spell]).per_request_bytes == 100 * MB
    # A replica started beside the readings: its predecessor's memory may still be in the sum.
    replaced = [*spell[:2], {**spell[2], "starts": 1, "rss_mb": 2400.0}, *spell[3:]]
    assert observed.from_points([*rest, *replaced]).per_request_bytes is None
    # A gap at rest within an export interval: the requests gauge may not have caught up with memory.
    gap = [spell[0], {**spell[1], "ongoing": 0.0}, {**spell[2], "rss_mb": 2400.0}, *spell[3:]]
    assert observed.from_points([*rest, *gap]).per_request_bytes is None
    # Nor when the replicas reporting change within the spell.
    grown = [*spell[:2], {**spell[2], "replicas": 2, "rss_mb": 2400.0}, *spell[3:]]
    assert observed.from_points([*rest, *grown]).per_request_bytes is None


def test_summaries_and_readings_without_memory_are_not_used():
    assert observed.from_points([]) is None
    assert observed.from_points([{"t": 0, "ongoing": 3.0, "p50": 10}]) is None
    summary = {"t": 0, "summary": 12, "replicas": 1, "rss_mb": 3000.0, "ongoing": 1.0}
    assert observed.from_points([summary]) is None
    at_rest_only = observed.from_points([{"t": 0, "replicas": 2, "rss_mb": 800.0, "ongoing": 0.0}])
    assert at_rest_only.baseline_bytes == 400 * MB and at_rest_only.per_request_bytes is None
    assert "no reading inside a busy spell" in at_rest_only.reason


def test_without_a_reading_at_rest_the_least_a_replica_used_stands_for_its_baseline():
    seen = observed.from_points(
        [
            {"t": 0, "replicas": 1, "rss_mb": 600.0, "ongoing": 1.0},
            {"t": 5, "replicas": 1, "rss_mb": 1000.0, "ongoing": 2.0},
            {"t": 10, "replicas": 1, "rss_mb": 1000.0, "ongoing": 2.0},
        ]
    )
    assert seen.baseline_bytes == 600 * MB and seen.idle_readings == 0
    assert seen.per_request_bytes == 200 * MB  # (1000 - 600) / 2: below the truth, never above


def curve(baseline_mib: int, per_request_mib: int) -> measurements.Memory:
    found = Curve(
        axis="concurrency",
        device="cpu",
        baseline_bytes=baseline_mib * MIB,
        points=[(k, (baseline_mib + k * per_request_mib) * MIB) for k in (1, 2, 4)],
        measured_at=datetime(2026, 12, 1, tzinfo=UTC),
        calibration_id=4,
        service_s={1.0: 1.0, 2.0: 1.0, 4.0: 1.0},
    )
    return measurements.memory_from_curve(found)


def current() -> sizing.Current:
    return sizing.Current(
        max_ongoing_requests=8,
        max_queued_requests=-1,
        num_replicas=None,
        ray_version="2.60.0",
        autoscaling={"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 4},
    )


def test_traffic_heavier_than_the_calibration_lowers_the_values_and_never_raises_them():
    budget = measurements.Budget(2000 * MIB, 1, "budget")
    calibrated = curve(200, 100)
    before = sizing.compute(current(), calibrated, budget, measurements.Load(), latency_objective_ms=10_000)
    heavier = observed.Observed(200 * MIB, 400 * MIB, 3, 5, "traffic")
    floored = measurements.with_traffic_floor(calibrated, heavier)
    after = sizing.compute(current(), floored, budget, measurements.Load(), latency_objective_ms=10_000)
    assert floored.peak(4) == 1800 * MIB and "Calibrate with a heavier representative request" in floored.reason
    assert after.plan["replicas"] * after.plan["concurrency"] < before.plan["replicas"] * before.plan["concurrency"]
    lighter = observed.Observed(200 * MIB, 50 * MIB, 3, 5, "traffic")
    assert measurements.with_traffic_floor(calibrated, lighter) is calibrated


def test_traffic_alone_is_a_lower_bound_and_the_wizard_still_calibrates_first():
    seen = observed.Observed(300 * MIB, 120 * MIB, 4, 6, "Ray's per-process memory: ...")
    memory = measurements.memory_from_traffic(seen)
    assert memory.lower_bound and memory.source == "metrics"
    out = sizing.compute(
        current(), memory, measurements.Budget(4000 * MIB, 1, "b"), measurements.Load(), latency_objective_ms=10_000
    )
    assert out.needs_calibration and all(out.patch(r) is None for r in ("R1", "R2", "R10"))
    assert measurements.memory_from_traffic(observed.Observed(300 * MIB, None, 4, 0, "")) is None


def test_a_kill_without_idle_peers_takes_its_baseline_from_traffic_and_the_larger_bound():
    killed = [ReplicaMemory("a", "M", "r1", 2400 * MIB, True)]
    alone = measurements.memory_from_kill(killed, "a", "M", in_flight=4, cap=8)
    assert alone.baseline_bytes == 0 and alone.per_request_bytes == 600 * MIB
    seen = observed.Observed(400 * MIB, 700 * MIB, 2, 3, "traffic")
    both = measurements.memory_from_kill(killed, "a", "M", in_flight=4, cap=8, observed=seen)
    assert both.lower_bound and both.baseline_bytes == 400 * MIB and both.per_request_bytes == 700 * MIB
    assert "traffic showed 400 MiB per replica at rest" in both.reason


def test_prometheus_gives_the_same_memory_reading():
    def answer(request: httpx.Request) -> httpx.Response:
        promql = request.url.params["query"]
        if "ray_component_rss_mb" in promql:
            result = [
                {"metric": {"Component": "ray::ServeReplica:reference:Generator"}, "value": [0, "1200.5"]},
                {
                    "metric": {"Component": "ray::ServeReplica:reference:Generator.handle_request_with_rejection"},
                    "value": [0, "0"],
                },
                {"metric": {"Component": "ray::ServeController"}, "value": [0, "150"]},
            ]
        elif promql.startswith("count by") and "ray_serve_replica_processing_queries" in promql:
            result = [{"metric": {"application": "reference", "deployment": "Generator"}, "value": [0, "2"]}]
        elif "ray_serve_replica_processing_queries" in promql:
            result = [{"metric": {"application": "reference", "deployment": "Generator"}, "value": [0, "3"]}]
        else:
            result = []
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})

    reading = prometheus_readings.read("http://prom.test:9090", 'cluster="c"', transport=httpx.MockTransport(answer))
    dep = reading.deployments[KEY]
    assert (dep.rss_mb, dep.replicas, dep.ongoing) == (1200.5, 2, 3.0)
