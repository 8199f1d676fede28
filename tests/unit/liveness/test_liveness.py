"""The worker and beat are seen to run, or not: heartbeats, the staleness rule, the banner every
page carries and what /healthz says."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from celery.signals import after_task_publish
from django.urls import reverse
from django.utils import timezone

from apps.liveness import services
from apps.liveness.models import Heartbeat
from controlplane import celery as celery_module
from workers import tasks

NOW = datetime(2026, 11, 30, 11, 0, tzinfo=UTC)
INTERVAL = timedelta(seconds=10)


def liveness(worker_ago: timedelta | None, beat_ago: timedelta | None) -> services.Liveness:
    return services.Liveness(
        worker_at=None if worker_ago is None else NOW - worker_ago,
        beat_at=None if beat_ago is None else NOW - beat_ago,
        now=NOW,
        stale_after=3 * INTERVAL,
    )


def test_ticks_within_three_intervals_are_not_stale_and_name_nobody():
    beats = liveness(3 * INTERVAL, INTERVAL)

    assert not beats.worker_stale and not beats.beat_stale and beats.stalled is None


def test_past_three_intervals_without_a_tick_the_worker_is_stale_and_named_while_beat_sends():
    beats = liveness(3 * INTERVAL + timedelta(seconds=1), INTERVAL)

    assert beats.worker_stale and not beats.beat_stale
    assert beats.stalled == "worker" and beats.stalled_since == NOW - 3 * INTERVAL - timedelta(seconds=1)


def test_when_beat_sends_no_tick_either_beat_is_named_since_its_own_heartbeat():
    beats = liveness(timedelta(minutes=5), timedelta(minutes=4))

    assert beats.stalled == "beat" and beats.stalled_since == NOW - timedelta(minutes=4)


def test_a_beat_that_never_recorded_a_heartbeat_is_not_blamed():
    assert liveness(timedelta(minutes=5), None).stalled == "worker"


def test_before_any_tick_the_worker_is_stale_with_no_time_at_all():
    beats = liveness(None, None)

    assert (
        beats.worker_stale and beats.stalled == "worker" and beats.stalled_since is None and beats.since_label is None
    )


def test_the_time_is_given_in_the_pages_timezone_with_the_date_when_it_is_not_today():
    with timezone.override("Europe/Berlin"):
        assert liveness(timedelta(minutes=7), INTERVAL).since_label == "11:53"
        assert liveness(timedelta(days=2), INTERVAL).since_label == "28 Nov 12:00"


@pytest.mark.django_db
def test_the_rule_counts_three_of_the_configured_tick_intervals(settings):
    settings.FLEETDECK_TICK_INTERVAL_S = 2
    services.record(Heartbeat.Process.WORKER, at=NOW - timedelta(seconds=6))

    assert not services.current(now=NOW).worker_stale
    assert services.current(now=NOW + timedelta(seconds=1)).worker_stale


@pytest.mark.django_db
def test_recording_again_moves_the_one_row_of_a_process():
    services.record(Heartbeat.Process.WORKER, at=NOW - timedelta(minutes=1))
    services.record(Heartbeat.Process.WORKER, at=NOW)

    assert list(Heartbeat.objects.values_list("process", "at")) == [("worker", NOW)]


@pytest.mark.django_db
def test_the_tick_records_the_workers_heartbeat():
    tasks.tick()

    assert timezone.now() - Heartbeat.objects.get(process="worker").at < timedelta(seconds=5)


@pytest.mark.django_db(transaction=True)  # beat drops stale connections itself, which a test transaction forbids
def test_beat_records_a_heartbeat_when_it_starts_and_each_time_it_sends_the_tick():
    celery_module._beat_heartbeats(sender=None)
    try:
        started = Heartbeat.objects.get(process="beat").at
        Heartbeat.objects.filter(process="beat").update(at=started - timedelta(minutes=1))
        after_task_publish.send(sender="fleet.sync_cluster")
        assert Heartbeat.objects.get(process="beat").at == started - timedelta(minutes=1)

        after_task_publish.send(sender="fleet.tick")

        assert Heartbeat.objects.get(process="beat").at >= started
    finally:
        after_task_publish.disconnect(celery_module._on_beat_publish)


@pytest.fixture
def page(client, people):
    client.force_login(people["viewer"])
    return lambda: client.get(reverse("fleet:overview")).content.decode()


def banner_of(html: str) -> str | None:
    if "liveness-banner" not in html:
        return None
    section = html.split("liveness-banner", 1)[1].split("</section>", 1)[0]
    return " ".join(section.replace("<strong>", "").replace("</strong>", "").split("\n")).split(">", 1)[1]


@pytest.mark.django_db
def test_every_page_says_when_the_worker_has_not_run_for_three_ticks(page, settings):
    settings.TIME_ZONE = "UTC"
    stopped = timezone.now().replace(hour=10, minute=53, second=0, microsecond=0)
    if stopped > timezone.now() - timedelta(minutes=1):
        stopped -= timedelta(days=1)
    services.record(Heartbeat.Process.WORKER, at=stopped)
    services.record(Heartbeat.Process.BEAT, at=timezone.now())

    banner = banner_of(page())

    time_shown = "10:53" if stopped.date() == timezone.now().date() else f"{stopped:%d %b} 10:53"
    assert f"Fleetdeck's worker has not run since {time_shown}: syncs and incident detection are paused." in banner


@pytest.mark.django_db
def test_the_banner_names_beat_when_beat_sends_no_tick(page):
    services.record(Heartbeat.Process.WORKER, at=timezone.now() - timedelta(minutes=10))
    services.record(Heartbeat.Process.BEAT, at=timezone.now() - timedelta(minutes=9))

    banner = banner_of(page())

    assert "Fleetdeck's beat has not run since" in banner and "celery -A controlplane beat" in banner


@pytest.mark.django_db
def test_a_fresh_install_says_no_tick_has_run_yet_rather_than_a_time(page):
    assert "Fleetdeck's worker has not run yet: syncs and incident detection wait for it." in banner_of(page())


@pytest.mark.django_db
def test_no_banner_while_the_worker_ticks(page, client):
    services.record(Heartbeat.Process.WORKER)
    services.record(Heartbeat.Process.BEAT)

    assert banner_of(page()) is None
    assert "liveness-banner" not in client.get(reverse("login")).content.decode()


@pytest.mark.django_db
def test_healthz_reports_a_dead_worker_and_still_answers_200(client):
    services.record(Heartbeat.Process.WORKER, at=datetime(2026, 11, 30, 10, 53, tzinfo=UTC))
    services.record(Heartbeat.Process.BEAT)

    response = client.get("/healthz")

    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["worker"] == {"last_tick_at": "2026-11-30T10:53:00Z", "stale": True}
    assert body["beat"]["stale"] is False


@pytest.mark.django_db
def test_healthz_before_any_tick_gives_no_time(client):
    body = client.get("/healthz").json()

    assert body["worker"] == {"last_tick_at": None, "stale": True}
    assert body["beat"] == {"last_tick_sent_at": None, "stale": True}


# --- a tick handler that raises ----------------------------------------------------------------


@pytest.fixture
def three_handlers(monkeypatch):
    """The tick's registry with three handlers of its own: the middle one raises while `broken` says so."""
    from apps.core import ticks
    from apps.core.jobs import Job

    monkeypatch.setattr(ticks, "_handlers", {})
    state = {"broken": True}

    def before():
        yield Job("fleet.sync_cluster", (1,))

    def middle():
        yield Job("fleet.sync_cluster", (2,))
        if state["broken"]:
            raise LookupError("a row this handler expected is gone")

    def after():
        yield Job("fleet.sync_cluster", (3,))

    ticks.register("before", 10, before)
    ticks.register("middle", 20, middle)
    ticks.register("after", 30, after)
    return state


@pytest.mark.django_db
def test_a_tick_handler_that_raises_is_logged_and_counted_and_the_others_still_run(three_handlers, caplog, client):
    sent = []

    assert services.run_tick(sent.append) == ["middle"]

    assert [job.args for job in sent] == [(1,), (2,), (3,)]
    assert "Tick handler middle failed; the other handlers ran." in caplog.text
    assert "a row this handler expected is gone" in caplog.text
    failing = client.get("/healthz").json()["tick"]["failing_handlers"]
    assert [(row["handler"], row["ticks_in_a_row"]) for row in failing] == [("middle", 1)]
    # A public URL: the handler's name and count, never its error.
    assert "expected is gone" not in client.get("/healthz").content.decode()

    services.run_tick(sent.append)
    assert client.get("/healthz").json()["tick"]["failing_handlers"][0]["ticks_in_a_row"] == 2


@pytest.mark.django_db
def test_a_handler_that_runs_again_is_no_longer_shown_as_failing(three_handlers, client, django_assert_num_queries):
    services.run_tick(lambda job: None)
    three_handlers["broken"] = False

    assert services.run_tick(lambda job: None) == []
    assert client.get("/healthz").json()["tick"]["failing_handlers"] == []
    # Once healthy, a tick reads the failing handlers and writes nothing about them.
    with django_assert_num_queries(1):
        services.run_tick(lambda job: None)


@pytest.mark.django_db
def test_the_worker_tick_sends_the_other_handlers_jobs_when_one_raises(three_handlers, monkeypatch):
    published = []
    monkeypatch.setattr(
        "celery.app.task.Task.apply_async", lambda self, args=None, kwargs=None, **options: published.append(args)
    )
    tasks.tick()
    assert published == [(1,), (2,), (3,)]


@pytest.mark.django_db
def test_every_registered_handler_runs_on_an_empty_database_without_failing():
    """The real handlers, as registered."""
    assert services.run_tick(lambda job: None) == []


@pytest.mark.django_db
def test_a_handler_that_returns_a_count_sends_nothing_and_does_not_fail(monkeypatch):
    from apps.core import ticks

    monkeypatch.setattr(ticks, "_handlers", {"prune": (1, lambda: 42)})
    sent = []
    assert services.run_tick(sent.append) == [] and sent == []
