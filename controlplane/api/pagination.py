"""How every API list is paged.

Page numbers (`?page=`) stay the default, with `count`, `next` and `previous` as clients read
them, but the count stops once it passes COUNT_CAP rows (or the end of the page asked for, when
that is further): counting 100,000 incidents for every page cost more than the page itself.
`count_capped` says when there are more rows than `count`. Version 2 counts only when asked
(`?count=true`) and tells whether a next page exists by reading one row more than the page.

Lists in time order (incidents, changes, rollouts, audit events, config revisions, maintenance
runs, calibrations, wizards) also page by keyset: `?cursor=` (empty for the first page) answers
`next` and `previous` links that carry the last row's position, so a deep page costs what the
first one does, and rows arriving meanwhile never shift a page. Version 2 pages them so by
default (`StreamPagination`). Like NetBox's paginator, both refuse an unordered queryset: its
pages would overlap. Both build the page's instances with `controlplane.api.lean`.
"""

from __future__ import annotations

from django.core.exceptions import FieldDoesNotExist, ImproperlyConfigured
from django.core.paginator import InvalidPage, Paginator
from django.db.models import QuerySet
from django.utils.functional import cached_property
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import CursorPagination, PageNumberPagination
from rest_framework.response import Response
from rest_framework.utils.urls import remove_query_param, replace_query_param

from controlplane.api.lean import lean
from controlplane.api.versioning import V2

COUNT_CAP = 1000


def require_ordered(queryset) -> None:
    if isinstance(queryset, QuerySet) and not queryset.ordered:
        raise ImproperlyConfigured(f"A {queryset.model._meta.label} list must be ordered to be paged.")


class CappedPaginator(Paginator):
    """Counts at most `limit + 1` rows: enough to know that page `limit / per_page` is full and
    has a next one. `limit` None counts everything."""

    def __init__(self, object_list, per_page, *, limit: int | None):
        super().__init__(object_list, per_page)
        self.limit = limit

    @cached_property
    def count(self) -> int:
        if self.limit is None or not isinstance(self.object_list, QuerySet):
            return super().count
        # Any `limit + 1` rows tell: the count needs no order, so no sort and no index walk.
        rows = self.object_list.order_by()
        if not rows.query.distinct and not rows.query.combinator:
            # Only the keys: the columns a list annotates from related rows (names) would keep their
            # joins in the count, where the database drops an outer join nothing reads.
            rows = rows.values("pk")
        return rows[: self.limit + 1].count()

    @property
    def capped(self) -> bool:
        return self.limit is not None and self.count > self.limit


class CappedCountPagination(PageNumberPagination):
    count_query_param = "count"

    def counted(self, request) -> bool:
        """Version 2 counts only when asked (`?count=true`): the count is a query of its own, which
        cost a list about as much as its page."""
        return request.version != V2 or request.query_params.get(self.count_query_param) in ("true", "1")

    def paginate_queryset(self, queryset, request, view=None):
        require_ordered(queryset)
        queryset = lean(queryset) if isinstance(queryset, QuerySet) else queryset
        self.request = request
        page_size = self.get_page_size(request)
        raw = request.query_params.get(self.page_query_param) or 1
        self.uncounted = None
        if raw not in self.last_page_strings and not self.counted(request):
            return self._uncounted_page(queryset, raw, page_size)
        if raw in self.last_page_strings:
            paginator = CappedPaginator(queryset, page_size, limit=None)
            number = paginator.num_pages
        else:
            try:
                wanted = max(int(raw), 1)
            except (TypeError, ValueError):
                wanted = 1  # the paginator refuses the raw value below, as DRF's does
            limit = max(COUNT_CAP, wanted * page_size)
            # A page past any table's size is counted exactly, as the database takes no such LIMIT.
            paginator = CappedPaginator(queryset, page_size, limit=limit if limit < 2**62 else None)
            number = raw
        try:
            self.page = paginator.page(number)
        except InvalidPage as exc:
            raise NotFound(self.invalid_page_message.format(page_number=number, message=str(exc))) from exc
        if paginator.num_pages > 1 and self.template is not None:
            self.display_page_controls = True
        return list(self.page)

    def _uncounted_page(self, queryset, raw, page_size: int) -> list:
        """Page `raw` and whether another follows, from one query of `page_size + 1` rows."""
        try:
            number = int(raw)
            if number < 1:
                raise ValueError
        except (TypeError, ValueError) as exc:
            raise NotFound(self.invalid_page_message.format(page_number=raw, message="Invalid page.")) from exc
        start = (number - 1) * page_size
        rows = list(queryset[start : start + page_size + 1])
        if not rows and number > 1:
            raise NotFound(self.invalid_page_message.format(page_number=raw, message="That page contains no results"))
        self.uncounted = (number, len(rows) > page_size)
        return rows[:page_size]

    def get_next_link(self):
        if self.uncounted is None:
            return super().get_next_link()
        number, more = self.uncounted
        url = self.request.build_absolute_uri()
        return replace_query_param(url, self.page_query_param, number + 1) if more else None

    def get_previous_link(self):
        if self.uncounted is None:
            return super().get_previous_link()
        number, _ = self.uncounted
        url = self.request.build_absolute_uri()
        if number == 1:
            return None
        if number == 2:
            return remove_query_param(url, self.page_query_param)
        return replace_query_param(url, self.page_query_param, number - 1)

    def get_paginated_response(self, data):
        if self.uncounted is not None:
            return Response({"next": self.get_next_link(), "previous": self.get_previous_link(), "results": data})
        paginator = self.page.paginator
        return Response(
            {
                "count": min(paginator.count, paginator.limit) if paginator.capped else paginator.count,
                "count_capped": paginator.capped,
                "next": self.get_next_link(),
                "previous": self.get_previous_link(),
                "results": data,
            }
        )

    def get_paginated_response_schema(self, schema):
        body = super().get_paginated_response_schema(schema)
        body["properties"]["count"]["description"] = (
            f"Rows in the list, counted up to {COUNT_CAP:,} (or to the end of the page asked for)."
        )
        body["properties"] = {
            "count": body["properties"].pop("count"),
            "count_capped": {
                "type": "boolean",
                "description": "True when the list holds more rows than `count`: follow `next` to the end.",
            },
            **body["properties"],
        }
        body["required"] = ["results"]
        body["description"] = (
            "`count` and `count_capped` come with numbered pages in version 1, and in version 2 with `count=true`."
        )
        return body

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        if getattr(getattr(view, "request", None), "version", None) == V2:
            parameters.append(
                {
                    "name": self.count_query_param,
                    "required": False,
                    "in": "query",
                    "description": "`true`: answer `count` and `count_capped` too (a query of its own).",
                    "schema": {"type": "boolean"},
                }
            )
        return parameters


def _own_column(model, order: str) -> bool:
    """Whether a keyset can follow `order`: a column of the row that is not a reference (a cursor
    carries the last row's value of it as text)."""
    try:
        field = model._meta.get_field(str(order).lstrip("-"))
    except FieldDoesNotExist:
        return False
    return field.concrete and not field.is_relation


class KeysetPagination(CursorPagination):
    """DRF's cursor pagination in the order the view's queryset already has (its own, or the one
    `?ordering=` chose). The first field is the position; rows that tie on it are told apart by
    an offset."""

    def paginate_queryset(self, queryset, request, view=None):
        require_ordered(queryset)
        self.ordering = tuple(queryset.query.order_by) or tuple(queryset.model._meta.ordering)
        if not _own_column(queryset.model, self.ordering[0]):
            raise ValidationError(
                {"cursor": ["Keyset pages follow a field of the row itself, not this order: ask for `page` instead."]}
            )
        return super().paginate_queryset(lean(queryset), request, view)

    def get_ordering(self, request, queryset, view):
        return self.ordering


class PageOrKeysetPagination(CappedCountPagination):
    """Page numbers, or keyset pages for a request that names `cursor`."""

    cursor_query_param = "cursor"

    def keyset_wanted(self, request) -> bool:
        return self.cursor_query_param in request.query_params

    def paginate_queryset(self, queryset, request, view=None):
        if not self.keyset_wanted(request):
            self.keyset = None
            return super().paginate_queryset(queryset, request, view)
        self.keyset = KeysetPagination()
        self.keyset.page_size = self.get_page_size(request)
        return self.keyset.paginate_queryset(queryset, request, view)

    def get_paginated_response(self, data):
        if self.keyset is None:
            return super().get_paginated_response(data)
        return self.keyset.get_paginated_response(data)

    def get_paginated_response_schema(self, schema):
        body = super().get_paginated_response_schema(schema)
        body["description"] += (
            " Keyset pages (with `cursor`, and in version 2 a time-ordered list without `page`) have only `next`, "
            "`previous` (links carrying a cursor) and `results`."
        )
        body["required"] = ["results"]
        return body

    def get_schema_operation_parameters(self, view):
        return [
            *super().get_schema_operation_parameters(view),
            {
                "name": self.cursor_query_param,
                "required": False,
                "in": "query",
                "description": "Keyset paging: empty for the first page, then the value in `next` or `previous`.",
                "schema": {"type": "string"},
            },
        ]


class StreamPagination(PageOrKeysetPagination):
    """For lists in time order, newest first (incidents, changes, rollouts, audit events...). In
    version 2 they page by keyset unless `page` or `count` is asked for: rows keep arriving at the head, which
    shifts numbered pages under a client walking them, and a client polling the head needs no
    count (the count query was a third of such a page's cost)."""

    def keyset_wanted(self, request) -> bool:
        if super().keyset_wanted(request):
            return True
        numbered = self.page_query_param in request.query_params or self.count_query_param in request.query_params
        return request.version == V2 and not numbered
