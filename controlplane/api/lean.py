"""Model instances for list pages, built without `Model.__init__`.

A list page builds one instance per row and per related row it selects (a page of changes: 250),
and Django's constructor walks every concrete field of the model for each, twice for a row loaded
with `only()` (once to place the deferred markers, once to set the values). `lean(queryset)`
builds the same instances the way unpickling does: the fetched values go straight into the
instance's `__dict__` with a fresh `ModelState`. A deferred field is absent from `__dict__` exactly
as Django leaves it, so reading it still loads it; `select_related` rows are cached on their
parent as Django caches them, and `prefetch_related` sees ordinary instances.

What the shortcut would skip falls back to Django's own path: a model with its own `__init__`,
a model someone listens to with `pre_init`/`post_init` (the signals `__init__` sends), and a row
that reaches a parent model through multi-table inheritance.
"""

from __future__ import annotations

import operator

from django.db.models import Model
from django.db.models.base import ModelState
from django.db.models.query import ModelIterable, RelatedPopulator
from django.db.models.signals import post_init, pre_init


def lean(queryset):
    """`queryset` yielding lean instances; anything else about it is unchanged."""
    if queryset._iterable_class is not ModelIterable:
        return queryset  # values(), values_list(): no instances to build
    queryset = queryset._chain()
    queryset._iterable_class = LeanModelIterable
    return queryset


def _builder(model):
    """A function (db, attnames, values) -> instance, or None where only Django's constructor is right."""
    if model.__init__ is not Model.__init__ or pre_init.has_listeners(model) or post_init.has_listeners(model):
        return None
    new = object.__new__

    def build(db, names, values):
        obj = new(model)
        state = ModelState()
        state.adding = False
        state.db = db
        attributes = obj.__dict__
        attributes.update(zip(names, values, strict=True))
        attributes["_state"] = state
        return obj

    return build


class LeanRelatedPopulator(RelatedPopulator):
    """Django's populator of one `select_related` model, building lean instances."""

    def __init__(self, klass_info, select, db):
        super().__init__(klass_info, select, db)
        self.related_populators = _populators(klass_info, select, db)
        self.build = None if self.reorder_for_init else _builder(self.model_cls)

    def populate(self, row, from_obj):
        if self.build is None:
            return super().populate(row, from_obj)
        data = row[self.cols_start : self.cols_end]
        if data[self.pk_idx] is None:
            obj = None
        else:
            obj = self.build(self.db, self.init_list, data)
            for related in self.related_populators:
                related.populate(row, obj)
        self.local_setter(from_obj, obj)
        if obj is not None:
            self.remote_setter(obj, from_obj)


def _populators(klass_info, select, db) -> list[LeanRelatedPopulator]:
    return [LeanRelatedPopulator(info, select, db) for info in klass_info.get("related_klass_infos", [])]


class LeanModelIterable(ModelIterable):
    """Django's ModelIterable (5.2) with lean instances: the same query, the same related rows."""

    def __iter__(self):
        queryset = self.queryset
        build = _builder(queryset.model)
        if build is None or queryset._known_related_objects:
            # Rows read through a related manager carry their parent object: Django's path sets it.
            yield from ModelIterable(queryset, self.chunked_fetch, self.chunk_size)
            return
        db = queryset.db
        compiler = queryset.query.get_compiler(using=db)
        results = compiler.execute_sql(chunked_fetch=self.chunked_fetch, chunk_size=self.chunk_size)
        select, klass_info, annotations = compiler.select, compiler.klass_info, compiler.annotation_col_map
        start, end = klass_info["select_fields"][0], klass_info["select_fields"][-1] + 1
        names = [column[0].target.attname for column in select[start:end]]
        related = _populators(klass_info, select, db)
        annotate = [(name, operator.itemgetter(at)) for name, at in (annotations or {}).items()]
        for row in compiler.results_iter(results):
            obj = build(db, names, row[start:end])
            for populator in related:
                populator.populate(row, obj)
            for name, get in annotate:
                setattr(obj, name, get(row))
            yield obj
