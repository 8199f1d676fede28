"""PostgreSQL timestamps parsed by `datetime.fromisoformat`.

Django reads each `timestamptz` through its own loader, a subclass of psycopg's pure-Python
one, so psycopg's C parser is never used for them: 5 µs a value, and a list page reads 250 to
300 of them (a change has five, each of its steps one). `fromisoformat` parses PostgreSQL's ISO
output in C in under 2 µs. Anything it does not read (BC dates, years past 9999, another
DateStyle) goes to Django's loader as before.
"""

from __future__ import annotations

from datetime import datetime


def read_with_fromisoformat(sender, connection, **kwargs) -> None:
    """`connection_created` receiver: the connection's timestamps are read by IsoTzLoader."""
    if connection.vendor != "postgresql" or connection.timezone is None:
        return  # USE_TZ off: Django's loader drops the zone, and nothing here is faster at that
    from django.db.backends.postgresql.psycopg_any import BaseTzLoader, is_psycopg3

    if not is_psycopg3:
        return

    class IsoTzLoader(BaseTzLoader):
        # Django compares this with its own zone at each cursor and registers its loader again
        # where they differ.
        timezone = connection.timezone

        def load(self, data):
            try:
                value = datetime.fromisoformat(bytes(data).decode())
            except ValueError:
                return super().load(data)
            if value.tzinfo is None:
                return super().load(data)
            return value.astimezone(self.timezone)

    connection.connection.adapters.register_loader("timestamptz", IsoTzLoader)
