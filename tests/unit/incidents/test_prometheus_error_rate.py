"""A deployment's errors read through Prometheus are on the same scale as its requests, as they are
from a difference of scrapes: the reading's error rate is the ratio Prometheus's rates give."""

from __future__ import annotations

import httpx

from apps.incidents import prometheus_readings


def test_errors_and_requests_of_a_reading_share_its_seconds():
    def answer(request):
        promql = request.url.params["query"]
        labels = {"application": "demo", "deployment": "Echo"}
        result = []
        if "ray_serve_deployment_request_counter_total" in promql:
            result = [{"metric": labels, "value": [0, "2.0"]}]
        elif "ray_serve_deployment_error_counter_total" in promql:
            result = [{"metric": {**labels, "exception_type": "ValueError"}, "value": [0, "0.5"]}]
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})

    reading = prometheus_readings.read("http://prom.test:9090", 'cluster="c"', transport=httpx.MockTransport(answer))
    echo = reading.deployments[("demo", "Echo")]
    assert echo.requests == 2.0 * reading.seconds and echo.errors == 0.5 * reading.seconds
    assert echo.errors / echo.requests == 0.25 and echo.errors_by_type == {"ValueError": 0.5 * reading.seconds}
