"""Values as an operator reads them: words, or flow YAML for patches, never Python reprs; one
family of binary units; diffs one line per line; and the pages that show patches and evidence."""

from __future__ import annotations

import re

import pytest
from django.template.loader import render_to_string
from django.urls import reverse

from apps.fleet.templatetags.fleet_tags import clock, duration, human, mebibytes, mib, ms, percent, weekdays, when
from apps.remediation.models import Finding
from tests.factories import ChangeFactory, ClusterFactory

# What str() of a Python dict, None or a bool looks like on a page.
REPR = re.compile(r"\{'|\bNone\b|\bTrue\b|\bFalse\b")


@pytest.mark.parametrize(
    "value, shown",
    [
        (None, "not set"),
        (False, "no"),
        (True, "yes"),
        (4.0, "4"),
        (0.25, "0.25"),
        ("GPU", "GPU"),
        ({"num_replicas": 1, "autoscaling_config": None}, "num_replicas: 1, autoscaling_config: not set"),
        (
            {"autoscaling_config": {"min_replicas": 1, "max_replicas": 4}},
            "autoscaling_config: {min_replicas: 1, max_replicas: 4}",
        ),
        ({"levels": [1, 2, None], "user_config": {}}, "levels: [1, 2, not set], user_config: {}"),
        ({}, "none"),
    ],
)
def test_values_are_shown_in_words_and_flow_yaml_never_as_python_reprs(value, shown):
    assert human(value) == shown


@pytest.mark.parametrize(
    "patch, shown",
    [
        ({"num_replicas": 1, "autoscaling_config": None}, "{num_replicas: 1, autoscaling_config: null}"),
        (
            {"autoscaling_config": {"min_replicas": 2, "upscale_delay_s": 3.5}},
            "{autoscaling_config: {min_replicas: 2, upscale_delay_s: 3.5}}",
        ),
        (None, "null"),
        (False, "false"),
        (8, "8"),
    ],
)
def test_patches_are_shown_as_the_flow_yaml_the_planner_takes_where_null_is_no_removal(patch, shown):
    assert human(patch, "yaml") == shown


@pytest.mark.parametrize(
    "size, shown",
    [
        (None, "—"),
        (512, "512 B"),
        (1536, "1.5 KiB"),
        (200 * 2**20, "200 MiB"),
        (1.4 * 2**30, "1.4 GiB"),
        (2**30, "1 GiB"),
        (7_582_819_328, "7.1 GiB"),
        (-3 * 2**20, "-3 MiB"),
    ],
)
def test_sizes_are_in_the_binary_units_rays_memory_monitor_prints(size, shown):
    assert mib(size) == shown.replace(" ", "\xa0")


def test_a_diff_is_one_line_per_line_with_nothing_between_the_lines():
    html = render_to_string("partials/diff.html", {"lines": ["--- now", "+++ after", "@@ -1 +1 @@", "-a: 1", "+a: 2"]})
    pre = re.search(r"<pre class=\"diff\">(.*)</pre>", html, re.S).group(1)
    assert "\n" not in pre
    assert pre.count("<span") == 5 and '<span class="diff-add">+a: 2</span>' in pre


def test_no_template_uses_filesizeformat_whose_units_read_as_decimal():
    from pathlib import Path

    templates = Path(__file__).resolve().parents[3] / "templates"
    assert [p.name for p in templates.rglob("*.html") if "filesizeformat" in p.read_text()] == []


@pytest.mark.parametrize(
    "seconds, shown",
    [
        (0.0093, "9\xa0ms"),
        (0.23, "230\xa0ms"),
        (0.9996, "1\xa0s"),
        (2.44, "2.4\xa0s"),
        (31.0, "31\xa0s"),
        (599.0, "599\xa0s"),
        (840.0, "14\xa0min"),
        (None, "—"),
    ],
)
def test_every_duration_reads_by_one_rule(seconds, shown):
    assert duration(seconds) == shown
    if seconds is not None:
        assert ms(seconds * 1000) == shown


def test_memory_in_mib_reads_as_bytes_do_and_shares_as_percent():
    assert mebibytes(318.44) == mib(318.44 * 1024 * 1024) == "318\xa0MiB"
    assert mebibytes(4404) == "4.3\xa0GiB" and mebibytes(None) == "—"
    assert percent(0.333) == percent(33.3, "100") == "33.3\xa0%"


def test_times_are_24_hour_in_the_servers_time_zone(settings):
    from datetime import UTC, datetime

    from django.utils import timezone

    at = datetime(2026, 12, 6, 17, 4, 5, 123456, tzinfo=UTC)
    with timezone.override("Europe/Berlin"):
        assert when(at) == "2026-12-06 18:04:05" and clock(at) == "18:04:05"
        assert clock(at, "ms") == "18:04:05.123" and when(at, "tz") == "2026-12-06 18:04:05 CET"
    assert when(None) == clock(None) == "—"


def test_templates_and_charts_format_through_the_shared_filters_only():
    """One time and number format across pages and charts: a template that formats a date or a float
    itself, or a chart that formats in the browser's own locale and zone, would read differently."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    own = re.compile(r"\|date:|\|time:|\|floatformat")
    # The LLM plan prints GiB to two decimals as vLLM's start-up log does, to be read against it.
    allowed = {"plan_result.html"}
    offenders = [p.name for p in (root / "templates").rglob("*.html") if own.search(p.read_text())]
    assert sorted(set(offenders) - allowed) == []
    scripts = [p for p in (root / "static" / "js").glob("*.js")]
    assert scripts and [p.name for p in scripts if "toLocale" in p.read_text()] == []


@pytest.fixture
def cluster(db, team):
    return ClusterFactory(name="gpu-prod", team=team)


def test_the_change_page_shows_its_options_without_python_reprs(client, people, cluster):
    config = {"applications": [{"name": "demo", "deployments": [{"name": "Model", "num_replicas": 1}]}]}
    change = ChangeFactory(
        cluster=cluster,
        patch={"num_replicas": 1, "autoscaling_config": None},
        reason="pin one replica",
        base_hash="a" * 64,
        base_config=config,
        new_config=config,
        new_hash="b" * 64,
    )
    client.force_login(people["viewer"])
    page = client.get(reverse("changes:detail", args=[change.pk])).content.decode()
    assert "{num_replicas: 1, autoscaling_config: null}" in page
    assert not REPR.findall(page)


def test_the_findings_page_shows_fixes_and_evidence_without_python_reprs(client, people, cluster):
    Finding.objects.create(
        cluster=cluster,
        application_name="demo",
        deployment_name="Model",
        rule="single-replica",
        severity="warning",
        evidence={"min_replicas": None, "max_surge_percent": None, "recycle_schedule": False},
        patch={"num_replicas": 2},
    )
    client.force_login(people["operator"])
    page = client.get(reverse("remediation:findings")).content.decode()
    assert "<code>{num_replicas: 2}</code>" in page
    assert "recycle_schedule: no" in page and "min_replicas: not set" in page
    assert not REPR.findall(page)


def test_maintenance_window_days_are_named_not_numbered():
    assert weekdays([4, 0]) == "Mon, Fri"
    assert weekdays([]) == ""
