"""List filters that name other objects by id. Such a filter compares ids and never checks that the
id exists: another team's object then filters to nothing, exactly like an id that does not exist,
where django-filter's default (a choice among all rows) answers "not a valid choice" only for ids
that do not exist, and so tells an outsider which ones do."""

from __future__ import annotations

from django import forms
from django.db import models
from django_filters import rest_framework as filters


class IdFilter(filters.NumberFilter):
    """A primary key: a whole number a database column holds. A fraction or a 300-digit number is
    refused as bad input instead of overflowing in the database driver."""

    field_class = forms.IntegerField

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("min_value", 1)
        kwargs.setdefault("max_value", 2**63 - 1)
        super().__init__(*args, **kwargs)


class IdFilterSet(filters.FilterSet):
    """The base of the filter sets the API builds from a view's `filterset_fields`."""

    FILTER_DEFAULTS = {
        **filters.FilterSet.FILTER_DEFAULTS,
        models.ForeignKey: {"filter_class": IdFilter},
        models.OneToOneField: {"filter_class": IdFilter},
    }


class FilterBackend(filters.DjangoFilterBackend):
    filterset_base = IdFilterSet
