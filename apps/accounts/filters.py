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

    def filter_queryset(self, request, queryset, view):
        """When the request names none of the filters: the queryset itself, or what the set's
        `when_unfiltered` makes of it (a set that filters by itself without one runs in full).
        django-filter would copy every filter and build and validate a form on each request to
        change nothing (a fixed cost that a page of cheap rows felt)."""
        filterset_class = self.get_filterset_class(view, queryset)
        if filterset_class is not None and not _names_a_filter(filterset_class, request):
            unfiltered = getattr(filterset_class, "when_unfiltered", None)
            if unfiltered is not None:
                return unfiltered(queryset)
            if not _filters_by_itself(filterset_class):
                return queryset
        return super().filter_queryset(request, queryset, view)


def _filters_by_itself(filterset_class) -> bool:
    """True when the filter set changes the list even with no parameter (e.g. hides removed rows)."""
    return (
        filterset_class.filter_queryset is not filters.FilterSet.filter_queryset
        or filterset_class.qs is not filters.FilterSet.qs
    )


def _names_a_filter(filterset_class, request) -> bool:
    # A range filter's parameters carry a suffix (`started_after`): any parameter that starts with a
    # filter's name counts.
    names = tuple(filterset_class.base_filters)
    return any(param.startswith(names) for param in request.query_params)


def _filters_anything(filterset_class, request) -> bool:
    return _filters_by_itself(filterset_class) or _names_a_filter(filterset_class, request)
