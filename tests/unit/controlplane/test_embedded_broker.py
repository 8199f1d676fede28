"""The embedded broker's transport on its own: corrupt rows are dropped and logged, a message is
deleted as it is taken, a forked process opens its own connections, and the settings pick it for
the embedded default and any sqla+ URL while other brokers keep their own transport."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from kombu import Connection

from controlplane.broker import Channel

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def broker(tmp_path):
    database = tmp_path / "broker.sqlite3"
    with Connection(f"sqlite:///{database}", transport="controlplane.broker:Transport") as connection:
        yield connection, database


def insert_rows(database: Path, queue: str, payloads: list[str]) -> None:
    with sqlite3.connect(database, timeout=20) as db:
        queue_id = db.execute("SELECT id FROM kombu_queue WHERE name = ?", (queue,)).fetchone()[0]
        db.executemany(
            "INSERT INTO kombu_message (visible, payload, version, queue_id) VALUES (1, ?, 1, ?)",
            [(payload, queue_id) for payload in payloads],
        )


def rows(database: Path) -> int:
    with sqlite3.connect(database) as db:
        return db.execute("SELECT count(*) FROM kombu_message").fetchone()[0]


def test_corrupt_rows_between_two_messages_are_dropped_and_logged_and_both_messages_arrive(broker, caplog):
    connection, database = broker
    queue = connection.SimpleQueue("work")
    queue.put({"n": 1})
    insert_rows(database, "work", ["", '{"body": "eyJu', "[]", json.dumps({"properties": {}})])
    queue.put({"n": 2})

    with caplog.at_level(logging.ERROR, logger="controlplane.broker"):
        first, second = queue.get(timeout=5), queue.get(timeout=5)

    assert (first.payload, second.payload) == ({"n": 1}, {"n": 2})
    dropped = [record.getMessage() for record in caplog.records]
    assert len(dropped) == 4 and all(
        line.startswith("dropped corrupt message") and "'work'" in line for line in dropped
    )
    assert rows(database) == 0
    queue.close()


def test_a_message_is_deleted_in_the_transaction_that_takes_it(broker):
    connection, database = broker
    queue = connection.SimpleQueue("work")
    queue.put({"n": 1})
    assert rows(database) == 1

    queue.get(timeout=5).ack()

    assert rows(database) == 0 and queue.qsize() == 0
    queue.close()


def test_the_file_is_in_wal_mode_so_readers_never_block_the_writer(broker):
    connection, database = broker
    connection.SimpleQueue("work").put({"n": 1})

    with sqlite3.connect(database) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_forked_process_opens_its_own_connection_instead_of_its_parents(broker):
    connection, database = broker
    connection.SimpleQueue("work").put({"n": 1})
    assert Channel._engines

    pid = os.fork()
    if pid == 0:  # the child: what a prefork pool process does when a task sends another
        ok = not Channel._engines
        with Connection(f"sqlite:///{database}", transport="controlplane.broker:Transport") as child:
            child.SimpleQueue("work").put({"n": 2})
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)

    assert os.waitstatus_to_exitcode(status) == 0
    queue = connection.SimpleQueue("work")
    assert [queue.get(timeout=5).payload for _ in range(2)] == [{"n": 1}, {"n": 2}]
    queue.close()


def _send_at_once(database: str, barrier) -> None:
    barrier.wait()
    with Connection(f"sqlite:///{database}", transport="controlplane.broker:Transport") as connection:
        connection.SimpleQueue("work").put({"n": os.getpid()})


def test_processes_starting_together_on_a_new_file_do_not_fail_on_each_others_tables_and_queue(tmp_path):
    database = tmp_path / "new.sqlite3"
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(6)
    processes = [context.Process(target=_send_at_once, args=(str(database), barrier)) for _ in range(6)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=60)

    assert [process.exitcode for process in processes] == [0] * 6
    assert rows(database) == 6


def settings_for(broker_url: str | None) -> list:
    code = (
        "import django, json; django.setup(); from django.conf import settings as s; "
        "print(json.dumps([s.CELERY_BROKER_URL, getattr(s, 'CELERY_BROKER_TRANSPORT', None), "
        "s.CELERY_BROKER_TRANSPORT_OPTIONS]))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETDECK_", "DJANGO_", "CELERY_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="controlplane.settings",
        FLEETDECK_DEBUG="1",
        FLEETDECK_VAR_DIR="/tmp/fleetdeck-settings-test",
    )
    if broker_url:
        env["CELERY_BROKER_URL"] = broker_url
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_embedded_default_is_a_sqlite_file_under_the_var_folder_on_this_transport():
    assert settings_for(None) == [
        "sqlite:////tmp/fleetdeck-settings-test/broker.sqlite3",
        "controlplane.broker:Transport",
        {},
    ]


def test_any_sqlalchemy_url_gets_the_same_transport_and_no_option_create_engine_would_refuse():
    assert settings_for("sqla+postgresql://u@db/fleetdeck") == [
        "postgresql://u@db/fleetdeck",
        "controlplane.broker:Transport",
        {},
    ]


def test_redis_keeps_its_own_transport():
    url, transport, options = settings_for("redis://127.0.0.1:6379/0")

    assert (url, transport) == ("redis://127.0.0.1:6379/0", None) and "visibility_timeout" in options
