"""OOM-4 (replicas killed together) counts crowding, not one replica killed again after its restart."""

from apps.incidents.services import killed_together


def test_one_replica_killed_twice_was_not_crowded_with_others():
    # Two kills on one node of the same one-replica deployment (killed, restarted, killed): no OOM-4.
    assert killed_together({"10.0.0.1": False}, replicas=1) == []
    # The same two kills of a deployment running three replicas, or of two deployments: crowded.
    assert killed_together({"10.0.0.1": False}, replicas=3) == ["10.0.0.1"]
    assert killed_together({"10.0.0.1": True}, replicas=1) == ["10.0.0.1"]
