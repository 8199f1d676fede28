"""A database for one benchmark run that nobody else uses, dropped afterwards."""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit


@contextmanager
def scratch_database(tag: str):
    """Yields (DATABASE_URL, engine name): a new database on the PostgreSQL server DATABASE_URL
    names (never that database itself), or else a throwaway SQLite file."""
    url = os.environ.get("DATABASE_URL", "")
    if url.startswith(("postgres://", "postgresql://")):
        import psycopg

        name = f"fleetdeck_bench_{tag}_{os.getpid()}"
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield urlunsplit(urlsplit(url)._replace(path="/" + name)), "PostgreSQL"
        finally:
            with psycopg.connect(url, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        return
    folder = tempfile.mkdtemp(prefix="fleetdeck-bench-")
    try:
        yield f"sqlite:///{folder}/bench.sqlite3", "SQLite"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def analyze() -> None:
    """What autovacuum does within a minute of a bulk load (a development server may run with it
    off): fresh planner statistics, and on PostgreSQL a visibility map for index-only scans."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE" if connection.vendor == "postgresql" else "ANALYZE")
