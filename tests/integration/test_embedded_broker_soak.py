"""The embedded broker under a real worker: while another process keeps sending tasks, corrupt
rows and malformed messages are written into the broker's own SQLite file; the worker drops and
logs each one, keeps running, and executes every valid task exactly once."""

from __future__ import annotations

import base64
import collections
import itertools
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SENT = 400
CORRUPT = 90


class EmbeddedWorker:
    """A Celery worker as `make run` starts it, on the embedded defaults in a private folder."""

    def __init__(self, root: Path):
        self.root = root
        self.records = root / "records.txt"
        self.records.touch()
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("FLEETDECK_", "DATABASE_", "CELERY_", "DJANGO_"))
        }
        self.env = {
            **env,
            "DJANGO_SETTINGS_MODULE": "controlplane.settings",
            "FLEETDECK_ALLOW_DEV_SECRET": "1",
            "FLEETDECK_VAR_DIR": str(root / "var"),
            "FLEETDECK_TEST_RECORD_FILE": str(self.records),
        }
        self.log = root / "worker.log"
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "controlplane",
                    "worker",
                    "--loglevel",
                    "INFO",
                    "--concurrency",
                    "2",
                    "--include",
                    "tests.broker_tasks",
                ],
                cwd=REPO,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def python(self, code: str) -> str:
        """Run `code` in a process of its own on the same settings, as the web process would."""
        prelude = "import django; django.setup()\nfrom controlplane.celery import app\n"
        result = subprocess.run(
            [sys.executable, "-c", prelude + textwrap.dedent(code)],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout

    def executed(self) -> list[int]:
        return [int(line) for line in self.records.read_text().split()]

    def wait_executed(self, count: int, timeout_s: float = 60) -> list[int]:
        deadline = time.monotonic() + timeout_s
        while len(done := self.executed()) < count:
            assert self.process.poll() is None, f"the worker exited with {self.process.returncode}\n{self.tail()}"
            assert time.monotonic() < deadline, f"{len(done)} of {count} executed\n{self.tail()}"
            time.sleep(0.2)
        return done

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)


@pytest.fixture
def worker(tmp_path):
    worker = EmbeddedWorker(tmp_path)
    yield worker
    worker.close()


def test_a_message_that_is_not_a_message_is_dropped_and_logged_and_the_worker_goes_on(worker):
    worker.python("""
        with app.connection_for_write() as connection:
            connection.default_channel._put("celery", {"not": "a message"})
        app.send_task("tests.record", args=[1])
    """)

    assert worker.wait_executed(1) == [1]
    assert worker.process.poll() is None


def envelope(headers, body) -> str:
    """A kombu message as the transport stores it, around any headers and JSON body."""
    return json.dumps(
        {
            "body": base64.b64encode(json.dumps(body).encode()).decode(),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": headers,
            "properties": {
                "delivery_tag": str(uuid.uuid4()),
                "body_encoding": "base64",
                "priority": 0,
                "delivery_info": {"exchange": "", "routing_key": "celery"},
            },
        }
    )


TASK_HEADERS = {"lang": "py", "task": "tests.record", "id": "00000000-0000-0000-0000-000000000000"}
# Rows the transport cannot read as a message: dropped there.
UNREADABLE_ROWS = [
    "",
    envelope(TASK_HEADERS, [[-1], {}, {}])[:90],  # a message cut short
    "\x00\xff garbage",
    "[1, 2, 3]",
    json.dumps({"properties": {}}),
    json.dumps({"body": "%%% not base64", "properties": {"delivery_tag": "t", "body_encoding": "base64"}}),
]
# Messages the transport reads but Celery cannot: dropped by the worker's consumer (Celery's own
# checks log the first as an invalid task message; it raises on the others).
UNREADABLE_TASKS = [
    envelope(TASK_HEADERS, "not [args, kwargs, options]"),
    envelope(TASK_HEADERS, [[-1], {}]),
    envelope({"task": ["not", "a", "name"]}, [[-1], {}, {}]),
    envelope({"task": "tests.record"}, [[-1], {}, {}]),  # no id
]


class Injector(threading.Thread):
    """Writes corrupt rows straight into the broker's SQLite file, as a torn write or another
    program would, while the writer sends."""

    def __init__(self, database: Path, count: int):
        super().__init__(daemon=True)
        self.database, self.count = database, count
        self.kinds = collections.Counter()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with sqlite3.connect(self.database, timeout=20) as db:
                queue_id = db.execute("SELECT id FROM kombu_queue WHERE name = 'celery'").fetchone()[0]
                rows = itertools.cycle([("row", r) for r in UNREADABLE_ROWS] + [("task", t) for t in UNREADABLE_TASKS])
                for kind, payload in itertools.islice(rows, self.count):
                    db.execute(
                        "INSERT INTO kombu_message (visible, payload, version, queue_id) VALUES (1, ?, 1, ?)",
                        (payload, queue_id),
                    )
                    db.commit()
                    self.kinds[kind] += 1
                    time.sleep(0.1)
        except BaseException as exc:  # reported by the test, not lost in the thread
            self.error = exc


def queue_declared(database: Path) -> bool:
    """The worker has created the broker's tables and its queue's row."""
    try:
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
            return db.execute("SELECT 1 FROM kombu_queue WHERE name = 'celery'").fetchone() is not None
    except sqlite3.OperationalError:
        return False


def test_a_worker_survives_corrupt_messages_under_load_and_runs_every_valid_task_once(worker):
    database = worker.root / "var" / "broker.sqlite3"
    deadline = time.monotonic() + 60
    while not queue_declared(database):
        assert time.monotonic() < deadline and worker.process.poll() is None, worker.tail()
        time.sleep(0.2)
    started = time.monotonic()
    injector = Injector(database, CORRUPT)

    injector.start()
    sent = json.loads(
        worker.python(f"""
        import json, time
        sent = []
        for number in range({SENT}):
            app.send_task("tests.record", args=[number])
            sent.append(number)
            time.sleep(0.02)
        print(json.dumps(sent))
    """)
    )
    injector.join(timeout=60)
    executed = worker.wait_executed(SENT)
    time.sleep(2)  # a duplicate would land after the last first run
    executed = worker.executed()
    elapsed = time.monotonic() - started

    assert injector.error is None
    log = worker.log.read_text(errors="replace")
    dropped_rows = log.count("dropped corrupt message")
    dropped_tasks = log.count("dropped a task message the worker cannot read") + log.count(
        "Received invalid task message"
    )
    print(
        f"\nembedded broker soak: sent {len(sent)}, executed {len(executed)} ({len(set(executed))} distinct), corrupt "
        f"injected {sum(injector.kinds.values())} (unreadable rows {injector.kinds['row']}, dropped by the transport "
        f"{dropped_rows}; unreadable tasks {injector.kinds['task']}, dropped by the consumer {dropped_tasks}), in "
        f"{elapsed:.1f} s"
    )
    assert worker.process.poll() is None, worker.tail()
    assert sorted(executed) == sorted(sent) == list(range(SENT))
    assert (dropped_rows, dropped_tasks) == (injector.kinds["row"], injector.kinds["task"])
    assert "Unrecoverable error" not in log
