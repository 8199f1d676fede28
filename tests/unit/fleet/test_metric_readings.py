"""What a metrics reading costs at fleet scale: a scrape parses only the series the readings use,
and a full window takes a new point without re-summarising its day."""

from __future__ import annotations

import random

from apps.fleet import metric_readings
from apps.fleet.metric_readings import SCRAPED, compact, relevant
from integrations import ray_metrics
from tests.conftest import FIXTURES


def samples(scrape: ray_metrics.Scrape) -> list[tuple]:
    return sorted((s.name, sorted(s.labels.items()), s.value) for s in scrape.samples)


def test_parsing_only_the_read_series_gives_the_samples_a_full_parse_keeps():
    text = (FIXTURES / "metrics_after_200_requests_filtered.prom").read_text()

    full = relevant(ray_metrics.parse(text, at=1.0))
    named = relevant(ray_metrics.parse(text, at=1.0, names=SCRAPED))

    assert samples(named) == samples(full)
    # Histogram buckets survive without their TYPE line: same names, `le` labels and values.
    assert any(s.name == f"{metric_readings.LATENCY}_bucket" and "le" in s.labels for s in named.samples)
    assert len(ray_metrics.parse(text, names=SCRAPED).samples) < len(ray_metrics.parse(text).samples) / 3


def test_a_reading_from_a_name_filtered_scrape_equals_one_from_a_full_parse():
    text = (FIXTURES / "metrics_after_200_requests_filtered.prom").read_text()
    later = text.replace("} 1", "} 3")  # counters and buckets moved on

    def reading(names):
        before = relevant(ray_metrics.parse(text, at=0.0, names=names))
        after = relevant(ray_metrics.parse(later, at=30.0, names=names))
        return metric_readings.read(before, after)

    assert reading(SCRAPED) == reading(None)


def test_a_full_window_compacted_again_is_unchanged_and_keeps_its_summary_counts():
    rng, at, points = random.Random(3), 1_000_000.0, []
    for _ in range(2 * 120 + 600):  # an hour of raw points and five more of readings every 30 s
        at += 30
        points = compact([*points, {"t": at, "p99": rng.uniform(10, 900), "errors": rng.randint(0, 2)}], now=at)

    assert compact(list(points), now=at) == points
    summaries = [p for p in points if "summary" in p]
    assert summaries and all(p["summary"] == 10 for p in summaries[1:-1])  # ten 30 s readings per 5 minutes


def _without_node_gauges(scrape: ray_metrics.Scrape) -> ray_metrics.Scrape:
    gauges = {metric_readings.MEM_USED, metric_readings.MEM_TOTAL}
    return ray_metrics.Scrape(at=scrape.at, samples=[s for s in scrape.samples if s.name not in gauges])


def test_a_scrape_missing_a_nodes_memory_gauges_keeps_the_previous_figures_not_zeros():
    # At RAY_metrics_report_interval_ms=1000 Ray's exporter leaves the node gauges out of about
    # every other scrape (seen on Ray 2.60); a zero point hid the node from every memory budget.
    text = (FIXTURES / "metrics_after_200_requests_filtered.prom").read_text()
    before = relevant(ray_metrics.parse(text, at=0.0))
    (total,) = [s for s in before.samples if s.name == metric_readings.MEM_TOTAL]
    (used,) = [s for s in before.samples if s.name == metric_readings.MEM_USED]
    gapped = _without_node_gauges(relevant(ray_metrics.parse(text, at=1.0)))

    node = metric_readings.read(before, gapped).nodes[total.labels["ip"]]
    assert (node.mem_total, node.mem_used) == (total.value, used.value) and total.value > 0

    # Missing from both scrapes: no point at all, rather than one that says the node has no memory.
    assert metric_readings.read(_without_node_gauges(before), gapped).nodes == {}
