"""A local head whose first ports clash is started again on new ones, not reported broken."""

import pytest

from apps.demo import local_ray
from apps.demo.local_ray import LocalRayHead

pytestmark = pytest.mark.ray


def test_a_head_given_one_port_twice_is_started_again_on_new_ports(monkeypatch):
    real = local_ray.free_ports
    picks = []

    def clashing_first(count):
        ports = real(count)
        if not picks:
            ports[-2] = ports[-3]  # object manager and node manager on one port: Ray refuses to start
        picks.append(ports)
        return ports

    monkeypatch.setattr(local_ray, "free_ports", clashing_first)
    head = LocalRayHead.start()
    try:
        head.wait_ready()
        assert head.attempts == 2
        assert "is trying to use a port number" in head.log_path.read_text()
        assert head.dashboard_port == picks[1][1] != picks[0][1]
        assert len(set(head.ports.values()) | {head.serve_http_port}) == len(head.ports) + 1
    finally:
        head.stop()
