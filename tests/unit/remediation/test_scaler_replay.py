"""R11's replay: the incident's load through the scaler's own decision function and through Serve's
autoscaler with R2's config, in a fluid model of the calibrated replicas and the queue bound."""

from __future__ import annotations

import pytest

from apps.remediation import scaler_replay, wizards
from apps.remediation.scaler_replay import compare, rates
from apps.scaler.decision import Policy
from tests.unit.remediation.test_wizard_scaler_offer import offer, readings
from tests.unit.remediation.wizard_helpers import actor

R2 = {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 2}


def square(calm_rps: float, burst_rps: float, *, calm_s: int = 300, burst_s: int = 120, every: int = 10) -> list:
    """Readings every `every` s: calm, a square burst, calm again; counts as the proxy reports them."""
    points, t = [], 0
    for seconds, rps in ((calm_s, calm_rps), (burst_s, burst_rps), (calm_s, calm_rps)):
        for _ in range(seconds // every):
            t += every
            points.append({"t": float(t), "seconds": float(every), "http": rps * every, "rps": rps})
    return points


def arms(points, **overrides):
    kwargs = (
        dict(
            concurrency=2,
            service_s=1.0,
            min_replicas=1,
            max_replicas=4,
            peak_bytes=None,
            queue_bound=8,
            latency_objective_ms=None,
            autoscaling=R2,
            reading_s=10.0,
            start_s=5.0,
        )
        | overrides
    )
    return compare(rates(points), **kwargs)


def test_a_steady_load_within_one_replica_is_served_alike_by_both():
    replay = arms(square(1.0, 1.0))
    for arm in ("scaler", "serve"):
        assert replay[arm]["failed"] == 0 and replay[arm]["p99_s"] == 1.0
        assert replay[arm]["peak_replicas"] == 1 and replay[arm]["reversals"] == 0
    assert replay["scaler"]["arrived"] == 720 and replay["seconds"] == 720


def test_a_square_burst_is_followed_sooner_by_the_scaler_than_by_serves_upscale_delay():
    replay = arms(square(0.5, 7.0))
    scaler, serve = replay["scaler"], replay["serve"]
    # 7 requests a second for 1 s each need 4 replicas of 2: both reach what memory holds.
    assert scaler["peak_replicas"] == serve["peak_replicas"] == 4
    # Serve waits upscale_delay_s (30 s) on a 30 s average; the scaler jumps at its next reading.
    assert scaler["failed"] < serve["failed"]
    assert scaler["p99_s"] <= serve["p99_s"]
    assert scaler["reversals"] <= 1 and serve["reversals"] <= 1
    # Even at 4 replicas, 8 slots at 1 s serve 8 a second: the burst of 7 fits once they are up.
    assert scaler["failed_share"] < 0.1


def test_the_scaler_never_goes_past_what_memory_holds_and_the_bound_sheds_the_rest():
    replay = arms(square(0.5, 30.0), max_replicas=2)
    assert replay["scaler"]["peak_replicas"] == 2
    # 30 a second against 4 slots of 1 s: most of the burst is shed, never an OOM kill.
    assert replay["scaler"]["failed_share"] > 0.5
    # The queue bound caps the wait: at most 8 queued behind one replica's 2 a second, plus the service.
    assert replay["scaler"]["p99_s"] <= 1.0 + 8 / 2


def test_what_arrived_is_read_at_the_proxy_and_short_loads_are_not_replayed():
    points = [
        {"t": 10.0, "seconds": 10.0, "http": 50, "rps": 3.0},  # 503s included: 5 a second arrived
        {"t": 20.0, "seconds": 10.0, "rps": 2.0},  # no proxy series: what the deployment counted
        {"t": 30.0, "rps": 9.0},  # no interval: nothing to spread
        {"t": 40.0, "seconds": 10.0, "http": 0},
    ]
    assert rates(points) == [(0.0, 10.0, 5.0), (10.0, 20.0, 2.0), (30.0, 40.0, 0.0)]
    assert arms(points[:2]) is None


def test_the_scaler_arm_decides_with_the_production_decision_function(monkeypatch):
    seen = []
    real = scaler_replay.decide

    def recording(signals, policy: Policy):
        seen.append((signals.now, policy.concurrency, policy.memory_ceiling))
        return real(signals, policy)

    monkeypatch.setattr(scaler_replay, "decide", recording)
    arms(square(0.5, 7.0), reading_s=30.0)
    # One decision per reading of the 720 s: every 30 s, as the sync interval reads metrics.
    assert len(seen) == 24 and {c for _, c, _ in seen} == {2} and {m for _, _, m in seen} == {4}


@pytest.mark.django_db
def test_the_wizard_quotes_the_replay_in_r11s_reasons(people, incident, cluster, calibrated):
    points = square(0.5, 7.0, every=10)
    readings(cluster, [p | {"ongoing": p["rps"], "queued": 0 if p["rps"] < 5 else 30} for p in points])
    wizard, _ = wizards.start(actor(people), incident=incident)
    values = offer(wizard).values
    replay = values["replay"]
    assert replay["start_measured"] is False and replay["start_s"] == 20.0 and replay["reading_s"] == 30
    # 150 in each calm, 840 in the burst.
    assert replay["scaler"]["arrived"] == replay["serve"]["arrived"] == 1140
    quoted = values["reasons"][-2]
    assert quoted.startswith("Replayed on these 720 s of readings (replicas starting in 20 s (assumed")
    assert f"{replay['scaler']['failed_share']:.1%} of 1,140 requests shed" in quoted
    assert "Serve's autoscaler with R2's config" in quoted
    # R2 here reacts after 5 s on 10 s reports, the scaler after a 30 s reading: the replay says so.
    assert replay["scaler"]["failed"] > replay["serve"]["failed"]
    assert "On this load R2's autoscaling serves better" in quoted and "FLEETDECK_SYNC_INTERVAL_S" in quoted


@pytest.mark.parametrize(
    "scaler, serve, verdict",
    [
        ((10, 2.0), (40, 9.0), "the scaler serves better"),
        ((10, 2.0), (10, 2.0), "both serve alike"),
        ((40, 9.0), (10, 2.0), "R2's autoscaling serves better"),
        ((10, 9.0), (40, 2.0), "Each is better on one figure"),
    ],
)
def test_the_reason_ends_with_which_arm_served_this_load_better(scaler, serve, verdict):
    from apps.remediation.scaler_offer import _verdict

    def arm(failed, p99):
        return {"failed": failed, "p99_s": p99}

    assert verdict in _verdict({"scaler": arm(*scaler), "serve": arm(*serve), "reading_s": 30})
