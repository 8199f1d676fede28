"""Rows by one cluster label, the key taken literally: the fleet page, the clusters API and a
rollout's selection filter clusters (or deployments through them) by `key=value` or `key`."""

from __future__ import annotations

import json

from django.db import NotSupportedError
from django.db.models import F, Func, QuerySet, TextField
from django.db.models.lookups import Exact, IsNull


class LabelValue(Func):
    """One label's value as text, or NULL. A lookup built from the key (`labels__<key>`) would read
    `x__isnull` or `x__regex` as a lookup and `a__b` as a path; even Django's `KeyTextTransform`
    reads a key of digits (`2024`, or `1_0`, which `int()` takes) as a list index."""

    output_field = TextField()

    def __init__(self, labels: str, key: str):
        super().__init__(F(labels))
        self.key = key

    def as_sqlite(self, compiler, connection, **extra_context):
        labels, params = compiler.compile(self.get_source_expressions()[0])
        return f"JSON_EXTRACT({labels}, %s)", (*params, f"$.{json.dumps(self.key)}")

    def as_postgresql(self, compiler, connection, **extra_context):
        labels, params = compiler.compile(self.get_source_expressions()[0])
        return f"({labels} ->> %s)", (*params, self.key)

    def as_sql(self, compiler, connection, **extra_context):
        raise NotSupportedError(f"Label filters are written for SQLite and PostgreSQL, not {connection.vendor}.")


def labelled(queryset: QuerySet, key: str, value: str | None, labels: str = "labels") -> QuerySet:
    """The rows whose labels (`labels`: the field, or the path to it) have `key`, set to `value`
    unless it is None. Label values are strings, so a key that is there has a value that is not NULL."""
    label = LabelValue(labels, key)
    return queryset.filter(IsNull(label, False) if value is None else Exact(label, value))
