"""The embedded broker: kombu's SQLAlchemy transport on a SQLite file under the var folder.

Every message is one row, written and taken in a transaction, so a crash never leaves half a
message behind (the filesystem transport it replaces wrote files that a reader could find empty
or partial). What kombu's transport lacks, this one adds:

- a row that is not a message (garbage, a truncated payload, a body that does not decode) is
  deleted and logged, never raised: kombu's transport raises it from the worker's consumer loop,
  which Celery treats as unrecoverable and exits;
- a message is deleted as it is taken, in the same transaction; kombu's marks it invisible and
  keeps it forever, so the table would grow with every task ever sent;
- SQLite waits for a lock instead of failing (the web process, the worker and beat all write
  the file), in WAL mode so that readers never block the writer;
- processes that start together on a new file (web, worker and beat under `make run`) do not
  fail on each other's tables and queue rows: kombu looks for them, then creates them, and the
  loser of that race gets an error;
- engines are not shared across fork: a prefork pool process would otherwise reuse its parent's
  SQLite connection, which SQLite forbids.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from json import loads
from queue import Empty

from kombu.transport import sqlalchemy as kombu_sqla
from sqlalchemy import event, text
from sqlalchemy.exc import DBAPIError, IntegrityError, SADeprecationWarning
from sqlalchemy.orm import sessionmaker

log = logging.getLogger(__name__)

# kombu's own models declare lazy="noload", which SQLAlchemy 2.1 deprecates: nothing here can change
# it, and the warning would open every worker's log.
warnings.filterwarnings("ignore", message="The ``noload`` loader strategy is deprecated", category=SADeprecationWarning)

# As long as the Django database waits on the same kind of lock.
SQLITE_BUSY_TIMEOUT_MS = 20_000
# A dropped message is logged with this much of its payload: enough to tell what wrote it.
LOGGED_PAYLOAD_CHARS = 200
PREPARE_ATTEMPTS = 5


def _sqlite_on_connect(dbapi_connection, connection_record) -> None:
    dbapi_connection.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")


def _prepare(engine) -> None:
    """kombu's tables, and on SQLite WAL mode (kept in the file), set up by one process at a time.
    Processes that start together on a new database race: on SQLite the write lock, taken first,
    puts them in turn, though switching the journal mode can still fail at once rather than wait
    (SQLite's deadlock avoidance); elsewhere the loser's CREATE fails. Either tries again shortly
    and finds the work done."""
    for attempt in range(1, PREPARE_ATTEMPTS + 1):
        try:
            with engine.connect() as connection:
                if engine.dialect.name == "sqlite":
                    connection.exec_driver_sql("PRAGMA journal_mode = WAL")
                    connection.exec_driver_sql("BEGIN IMMEDIATE")
                kombu_sqla.metadata.create_all(connection)
                connection.commit()
            return
        except DBAPIError:
            if attempt == PREPARE_ATTEMPTS:
                raise
            time.sleep(0.1 * attempt)


class Channel(kombu_sqla.Channel):
    def _engine_from_config(self):
        engine = super()._engine_from_config()
        if engine.dialect.name == "sqlite":
            event.listen(engine, "connect", _sqlite_on_connect)
        return engine

    def _open(self):
        url = self.connection.client.hostname
        with kombu_sqla._MUTEX:
            if url not in self._engines:
                engine = self._engine_from_config()
                _prepare(engine)
                self._engines[url] = engine, sessionmaker(bind=engine)
        return self._engines[url]

    def _get_or_create(self, queue):
        try:
            return super()._get_or_create(queue)
        except IntegrityError:
            # Another process inserted the queue between kombu's look-up and its insert.
            self.session.rollback()
            return super()._get_or_create(queue)

    def _get(self, queue):
        queue_id = self._get_or_create(queue).id
        while True:
            row_id, raw = self._take(queue_id)
            try:
                payload = loads(raw)
                # What the consumer does with it next: a payload this cannot read would be raised there.
                self.Message(payload, channel=self)
            except Exception as exc:  # whatever a row holds, raising it here ends the worker
                log.error(
                    "dropped corrupt message %s from queue %r (%s: %s): %r",
                    row_id,
                    queue,
                    type(exc).__name__,
                    exc,
                    raw[:LOGGED_PAYLOAD_CHARS],
                )
                continue
            return payload

    def _take(self, queue_id: int) -> tuple[int, str]:
        """The oldest message of the queue, deleted in the transaction that reads it."""
        session = self.session
        try:
            if session.bind.name == "sqlite":
                # The write lock first: a deferred transaction that read first could not upgrade
                # to a write while another process holds the lock, and would fail at once.
                session.execute(text("BEGIN IMMEDIATE TRANSACTION"))
            message = (
                session.query(self.message_cls)
                .with_for_update(skip_locked=True)
                .filter(self.message_cls.queue_id == queue_id)
                # Rows kombu's own transport left taken in a table it used before.
                .filter(self.message_cls.visible.is_(True))
                .order_by(self.message_cls.id)
                .limit(1)
                .first()
            )
            if message is None:
                raise Empty()
            taken = message.id, message.payload
            session.delete(message)
            session.commit()
        except BaseException:
            session.rollback()
            raise
        return taken


class Transport(kombu_sqla.Transport):
    Channel = Channel


def _forget_engines_after_fork() -> None:
    for engine, _ in Channel._engines.values():
        # close=False: the parent still owns those connections; the child opens its own.
        engine.dispose(close=False)
    Channel._engines.clear()


os.register_at_fork(after_in_child=_forget_engines_after_fork)
