"""Client of a Prometheus server's HTTP API (`/api/v1/query`): the only code that queries
Prometheus. It answers an instant vector as (labels, value) pairs, or Ray's series as a scrape of
Ray's own endpoint would have them."""

from __future__ import annotations

import time
from collections.abc import Collection

import httpx

from integrations.egress import AnswerTooSlow, PinnedTransport
from integrations.ray_metrics import MetricsUnavailable, Sample, Scrape


def query(
    base_url: str,
    promql: str,
    *,
    at: float | None = None,
    timeout_s: float = 5.0,
    transport: httpx.BaseTransport | None = None,
) -> list[tuple[dict, float]]:
    """`at` is the evaluation time (Unix seconds); None is the server's now."""
    params: dict[str, str | float] = {"query": promql}
    if at is not None:
        params["time"] = at
    try:
        with httpx.Client(
            timeout=timeout_s,
            follow_redirects=False,
            trust_env=False,
            transport=transport or PinnedTransport(),
            headers={"User-Agent": "fleetdeck-prometheus/1"},
        ) as client:
            response = client.get(f"{base_url.rstrip('/')}/api/v1/query", params=params)
    except AnswerTooSlow as exc:
        # Its own message names the deadline and the setting; "did not answer in time" would hide it.
        raise MetricsUnavailable(str(exc), transient=True) from exc
    except httpx.TimeoutException as exc:
        raise MetricsUnavailable(f"Prometheus at {base_url} did not answer in time.", transient=True) from exc
    except httpx.TransportError as exc:
        raise MetricsUnavailable(
            f"Cannot reach Prometheus at {base_url}: {str(exc) or exc.__class__.__name__}.", transient=True
        ) from exc
    try:
        body = response.json()
    except ValueError as exc:
        raise MetricsUnavailable(
            f"{base_url} did not answer Prometheus JSON (HTTP {response.status_code}).", transient=False
        ) from exc
    if body.get("status") != "success":
        raise MetricsUnavailable(
            f"Prometheus refused the query: {body.get('error') or response.status_code}.",
            transient=response.status_code >= 500,
        )
    if body.get("warnings"):
        # A partial answer (a store or remote-read source missing, as Thanos and federated setups say
        # in warnings) is short of series: summed, it would undercount what clients sent, and a
        # verification could call a failing window clean. No figure is better than a low one.
        warned = "; ".join(str(w) for w in body["warnings"])[:300]
        raise MetricsUnavailable(
            f"Prometheus answered a partial result ({warned}); no reading is taken.", transient=True
        )
    data = body.get("data") or {}
    if data.get("resultType") != "vector":
        raise MetricsUnavailable(f"Prometheus answered a {data.get('resultType')!r}, not a vector.", transient=False)
    out = []
    for item in data.get("result") or []:
        try:
            out.append((item.get("metric") or {}, float(item["value"][1])))
        except (KeyError, IndexError, TypeError, ValueError):
            continue
    return out


def series(
    base_url: str,
    names: Collection[str],
    selector: str = "",
    *,
    timeout_s: float = 5.0,
    transport: httpx.BaseTransport | None = None,
) -> Scrape:
    """The latest value of every series of `names` that `selector` matches, in one query. Counters
    come as totals, so two of these difference exactly like two scrapes of Ray's endpoint, without
    the extrapolation of increase()."""
    at = time.time()
    matchers = ", ".join(m for m in (f'__name__=~"{"|".join(sorted(names))}"', selector) if m)
    samples = []
    for labels, value in query(base_url, f"{{{matchers}}}", at=at, timeout_s=timeout_s, transport=transport):
        rest = {k: v for k, v in labels.items() if k != "__name__"}
        samples.append(Sample(labels.get("__name__", ""), rest, value))
    return Scrape(at=at, samples=samples)
