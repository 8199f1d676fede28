"""Timestamps read back exactly, through fromisoformat where the database is PostgreSQL and
through Django's loader for what fromisoformat does not read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.db import connection

from apps.core import timestamps
from apps.incidents.models import Incident
from tests.factories import IncidentFactory

pytestmark = pytest.mark.django_db

MOMENTS = [
    datetime(2026, 3, 29, 0, 59, 59, 123456, tzinfo=UTC),
    datetime(2026, 3, 29, 1, 0, 0, tzinfo=UTC),
    datetime(2026, 10, 25, 2, 30, 0, 1, tzinfo=timezone(timedelta(hours=5, minutes=30))),
    datetime(1, 1, 1, 0, 0, 0, tzinfo=UTC),
    datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
]


@pytest.mark.parametrize("moment", MOMENTS)
def test_a_timestamp_reads_back_as_the_same_instant_in_utc(moment):
    incident = IncidentFactory(started_at=moment)
    read = Incident.objects.get(pk=incident.pk).started_at
    assert read == moment and read.utcoffset() == timedelta(0)


def test_postgresql_connections_read_timestamps_with_fromisoformat_and_leave_the_rest_to_django():
    connection.ensure_connection()
    if connection.vendor != "postgresql":
        timestamps.read_with_fromisoformat(None, connection)
        assert not hasattr(connection.connection, "adapters")  # SQLite: nothing to register, nothing changed
        return
    assert connection.connection.adapters.get_loader(1184, 0).__name__ == "IsoTzLoader"
    with connection.cursor() as cursor:
        cursor.execute("SELECT '0044-03-15 12:00:00+00 BC'::timestamptz")
        with pytest.raises(Exception, match="BC"):  # Django's loader (psycopg's) refuses BC dates: as before
            cursor.fetchone()
        cursor.execute("SELECT '2026-12-03 20:25:19.5+05:30'::timestamptz")
        assert cursor.fetchone()[0] == datetime(2026, 12, 3, 14, 55, 19, 500000, tzinfo=UTC)
