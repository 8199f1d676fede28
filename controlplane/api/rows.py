"""Rows of read serializers written without DRF's per-request field building and per-row field walk.

A list page of 50 rows cost several times DRF's trivial endpoint in Python alone: a ModelSerializer
builds its fields by introspecting the model on every request, then walks them for every row
(`get_attribute`, `SkipField`, `to_representation` per field and row). `FastRows` compiles, once per
serializer class, a plan from the same declared fields (so the OpenAPI schema and the output keep
their shape) and writes each row from it: the attribute read and the conversion DRF would do,
without the walk. A field type the plan does not know is refused when the plan is compiled, so a
new field cannot silently write something DRF would not.

Most fields of a list row are a model column (or a column of a related row) that DRF writes as it
is: a name, a number, a flag, a JSON value, a related row's slug. The plan reads all of those in
one `operator.attrgetter` call, and calls a writer only for the fields that convert (datetimes,
method fields, nested rows). A row whose read fails (a related row that is None) is written
field by field, as DRF would.

`DRF_WALK = True` writes rows the DRF way again: tests compare the two outputs on every endpoint.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import FieldDoesNotExist, ObjectDoesNotExist
from django.db import models
from django.db.models.manager import BaseManager
from django.utils import timezone
from rest_framework import relations, serializers
from rest_framework.fields import SkipField, empty, is_simple_callable
from rest_framework.settings import ISO_8601, api_settings

DRF_WALK = False
SKIP = object()

Writer = Callable[[Any, Any], Any]


class FastRows:
    """Mixin for read-only (Model)Serializers; put it first: `class X(FastRows, serializers.ModelSerializer)`."""

    def to_representation(self, instance):
        return self.write_row(instance)

    def write_row(self, instance, given: dict | None = None, *, plan: Plan | None = None) -> dict:
        """The row; `given` names fields whose values the caller has (they are not read). `plan`: a
        nested serializer's, when this serializer writes the nested rows."""
        if DRF_WALK and plan is None:
            return super().to_representation(instance) if not given else self._walk_except(instance, given)
        plan = plan or type(self).__dict__.get("_row_plan") or _compile(type(self))
        if not given:
            try:
                read = plan.read(instance)
            except (AttributeError, KeyError, ObjectDoesNotExist):
                pass  # a related row that is not there: each field says what it writes instead
            else:
                values = read + tuple([write(self, instance) for write in plan.computed])
                if plan.may_skip and SKIP in values:
                    return {
                        name: value
                        for name, value in zip(plan.names, plan.order(values), strict=True)
                        if value is not SKIP
                    }
                return dict(zip(plan.names, plan.order(values), strict=True))
        row = {}
        for name, write in plan.fields:
            value = given[name] if given and name in given else write(self, instance)
            if value is not SKIP:
                row[name] = value
        return row

    def _walk_except(self, instance, given: dict) -> dict:
        row = {}
        for name, field in self.fields.items():
            if field.write_only:
                continue
            if name in given:
                row[name] = given[name]
                continue
            try:
                attribute = field.get_attribute(instance)
            except SkipField:
                continue
            row[name] = None if attribute is None else field.to_representation(attribute)
        return row


class Plan:
    """How a serializer writes a row: `fields` one writer per field (the field-by-field path);
    `read` the columns written as they are, in one call; `computed` the writers of the others;
    `order` puts the read and the computed values back in the declared order of `names`."""

    def __init__(self, fields: list[tuple[str, Writer]], direct: dict[str, str]):
        self.fields = fields
        self.names = tuple(name for name, _ in fields)
        paths = [direct[name] for name in self.names if name in direct]
        self.computed = [write for name, write in fields if name not in direct]
        self.may_skip = bool(self.computed)
        self.read = _tuple_getter(paths)
        placed = [name for name in self.names if name in direct] + [name for name in self.names if name not in direct]
        self.order = _tuple_getter([placed.index(name) for name in self.names], items=True)


def _tuple_getter(keys: list, *, items: bool = False) -> Callable[[Any], tuple]:
    """operator.attrgetter / itemgetter that always answers a tuple (they answer a bare value for one key)."""
    make = operator.itemgetter if items else operator.attrgetter
    if not keys:
        return lambda obj: ()
    if len(keys) == 1:
        get = make(keys[0])
        return lambda obj: (get(obj),)
    return make(*keys)


def _compile(cls) -> Plan:
    probe = cls()
    model = getattr(getattr(cls, "Meta", None), "model", None)
    prefetched = getattr(getattr(cls, "Meta", None), "prefetched_as", {})
    fields = [(name, field) for name, field in probe.fields.items() if not field.write_only]
    writers = [(name, _writer(field, model, prefetched.get(name))) for name, field in fields]
    direct = {name: path for name, field in fields if (path := _direct_path(field, model)) is not None}
    plan = Plan(writers, direct)
    cls._row_plan = plan
    return plan


# Serializer fields that write a model column's value unchanged, and the columns they do it for:
# a CharField's str() of a str, an IntegerField's int() of an int, a ChoiceField's lookup of a
# stored choice (itself).
_UNCHANGED = {
    serializers.CharField: (models.CharField, models.TextField),
    serializers.ChoiceField: (models.CharField, models.TextField, models.IntegerField),
    serializers.IntegerField: (models.IntegerField,),
    serializers.BooleanField: (models.BooleanField,),
    serializers.FloatField: (models.FloatField,),
}


def _direct_path(field, model) -> str | None:
    """The dotted attribute path whose value the field writes unchanged, or None when the field
    converts, computes or may call something. Only forward model fields qualify: their values
    are never callables and never need DRF's `get_attribute` fallbacks while the related rows
    are there."""
    if model is None or field.source == "*" or isinstance(field, serializers.SerializerMethodField):
        return None
    if isinstance(field, serializers.BaseSerializer):
        return None
    attrs = list(field.source_attrs)
    target, current = None, model
    for position, attr in enumerate(attrs):
        try:
            target = current._meta.get_field(attr)
        except FieldDoesNotExist:
            return None
        if not target.concrete:
            return None  # a reverse relation: a manager, not a value
        if position < len(attrs) - 1:
            if not (target.many_to_one or target.one_to_one) or target.null:
                return None  # a row without the related row would fall back to the slow path
            current = target.related_model
    if _pk_only(field):
        return ".".join([*attrs[:-1], target.attname])  # the key column, as DRF reads it
    if isinstance(field, relations.SlugRelatedField) and "__" not in field.slug_field:
        if not (target.many_to_one or target.one_to_one) or target.null:
            return None
        if type(field).to_representation is not relations.SlugRelatedField.to_representation:
            return None
        return ".".join([*attrs, field.slug_field])
    if target.is_relation:
        return None
    if isinstance(field, serializers.ReadOnlyField) and type(field).to_representation is (
        serializers.ReadOnlyField.to_representation
    ):
        return ".".join(attrs)
    if (
        isinstance(field, serializers.JSONField)
        and not field.binary
        and type(field).to_representation is (serializers.JSONField.to_representation)
    ):
        return ".".join(attrs)
    if _plain_big_integer(field):
        return ".".join(attrs) if isinstance(target, models.IntegerField) else None
    for kind, columns in _UNCHANGED.items():
        if type(field).to_representation is kind.to_representation and isinstance(field, kind):
            return ".".join(attrs) if isinstance(target, columns) else None
    return None


def _plain_big_integer(field) -> bool:
    """A BigIntegerField (a model's primary key) that writes the number, not its string."""
    return type(field).to_representation is serializers.BigIntegerField.to_representation and not getattr(
        field, "coerce_to_string", api_settings.COERCE_BIGINT_TO_STRING
    )


def _writer(field, model, prefetched_as: str | None = None) -> Writer:
    if isinstance(field, serializers.SerializerMethodField):
        method = field.method_name
        return lambda ser, obj: getattr(ser, method)(obj)
    if field.source == "*":
        raise TypeError(f"{field.field_name}: source='*' has no fast row")
    if isinstance(field, serializers.ListSerializer):
        return _nested_many(field, prefetched_as)
    if isinstance(field, serializers.BaseSerializer):
        raise TypeError(f"{field.field_name}: a nested single serializer has no fast row")
    get = _getter(field, model)
    if _plain_datetime(field):
        return _datetime_writer(field, get)
    convert = _converter(field)
    if convert is None:
        return lambda ser, obj: get(obj)

    def converted(ser, obj):
        value = get(obj)
        if value is None or value is SKIP:
            return value
        return convert(value)

    return converted


def _plain_datetime(field) -> bool:
    """A DateTimeField written as DRF writes it by default: ISO 8601 in the current time zone."""
    return (
        isinstance(field, serializers.DateTimeField)
        and type(field).to_representation is serializers.DateTimeField.to_representation
        and type(field).enforce_timezone is serializers.DateTimeField.enforce_timezone
        and not hasattr(field, "timezone")
        and str(getattr(field, "format", api_settings.DATETIME_FORMAT)).lower() == ISO_8601
        and settings.USE_TZ
    )


def _datetime_writer(field, get) -> Writer:
    """What DRF writes for an aware datetime, with the current time zone looked up once per
    serializer (a page) instead of once per value: the lookup cost more than the formatting."""

    def write(ser, obj):
        value = get(obj)
        if type(value) is not datetime or value.tzinfo is None:
            return value if value is None or value is SKIP else field.to_representation(value)
        zone = ser.__dict__.get("_current_zone") if ser is not None else None
        if zone is None:
            zone = timezone.get_current_timezone()
            if ser is not None:
                ser.__dict__["_current_zone"] = zone
        try:
            text = value.astimezone(zone).isoformat()
        except OverflowError:
            return field.to_representation(value)  # DRF's own error
        return text[:-6] + "Z" if text.endswith("+00:00") else text

    return write


def _nested_many(field, prefetched_as: str | None) -> Writer:
    """`prefetched_as`: the attribute a `Prefetch(..., to_attr=...)` fills with the rows, when the
    queryset has one (a plain list: Django then builds no manager and queryset per row); else the
    rows are read from the source as DRF does."""
    child = type(field.child)
    source = _getter(field, None)
    if prefetched_as is None:
        get = source
    else:

        def get(obj):
            rows = getattr(obj, prefetched_as, None)
            return source(obj) if rows is None else rows

    if not issubclass(child, FastRows):
        # DRF's list of the child's own rows (a child may write its rows itself).
        return lambda ser, obj: field.to_representation(get(obj))
    plan = child.__dict__.get("_row_plan") or _compile(child)
    if any(isinstance(f, serializers.SerializerMethodField) for f in field.child.fields.values()):
        raise TypeError(f"{field.field_name}: nested rows with method fields have no fast row")
    write_row = FastRows.write_row

    def nested(ser, obj):
        if DRF_WALK:
            return field.to_representation(get(obj))
        items = get(obj)
        if isinstance(items, BaseManager):
            items = items.all()
        # The parent serializer writes them (the child's plan needs no state of its own): the time
        # zone it looked up serves the nested datetimes too.
        return [write_row(ser, item, plan=plan) for item in items]

    return nested


def _getter(field, model) -> Callable[[Any], Any]:
    attrs = tuple(field.source_attrs)
    if _pk_only(field):
        # DRF reads the foreign key's column, not the related row.
        *parents, last = attrs
        attname = model._meta.get_field(last).attname if model is not None and not parents else None

        def pk(obj):
            if attname is not None:
                return getattr(obj, attname)
            for attr in parents:
                obj = getattr(obj, attr)
            value = obj.serializable_value(last)
            return getattr(value, "pk", value)

        return pk

    default, allow_null, required = field.default, field.allow_null, field.required
    # Whether a method is one DRF calls depends on the class, and asking (`inspect.signature`) cost
    # more than the rest of a row: `get_status_display` is a new partial object on every read.
    simple: dict[tuple[type, str], bool] = {}

    def get(obj):
        try:
            for attr in attrs:
                owner = obj
                try:
                    obj = getattr(obj, attr)
                except ObjectDoesNotExist:
                    return None
                if callable(obj):
                    key = (type(owner), attr)
                    call = simple.get(key)
                    if call is None:
                        call = simple[key] = is_simple_callable(obj)
                    if call:
                        obj = obj()
            return obj
        except (KeyError, AttributeError):
            if default is not empty:
                return field.get_default()
            if allow_null:
                return None
            if not required:
                return SKIP
            raise

    return get


def _pk_only(field) -> bool:
    """A primary key field that writes the key as it is: DRF reads it off the foreign key's column."""
    return (
        isinstance(field, relations.PrimaryKeyRelatedField)
        and field.pk_field is None
        and type(field).to_representation is relations.PrimaryKeyRelatedField.to_representation
    )


def _converter(field) -> Callable[[Any], Any] | None:
    """What DRF's `field.to_representation` does with a value that is not None; None: the value itself."""
    if _pk_only(field):
        return None
    if isinstance(field, relations.RelatedField):
        if isinstance(field, relations.SlugRelatedField) and "__" not in field.slug_field:
            slug = field.slug_field
            return lambda value: getattr(value, slug)
        raise TypeError(f"{field.field_name}: {type(field).__name__} has no fast row")
    if isinstance(field, serializers.ReadOnlyField):
        return None
    if isinstance(field, serializers.JSONField):
        # A subclass may write something other than the value (apps.core.serializer_fields redacts it).
        plain = not field.binary and type(field).to_representation is serializers.JSONField.to_representation
        return None if plain else field.to_representation
    if isinstance(field, serializers.BooleanField):
        return lambda value: value if value is True or value is False else field.to_representation(value)
    if isinstance(field, serializers.BigIntegerField) and not _plain_big_integer(field):
        return field.to_representation
    if isinstance(field, serializers.IntegerField):
        return lambda value: value if type(value) is int else int(value)
    if isinstance(field, serializers.FloatField):
        return float
    if isinstance(field, serializers.CharField):
        return lambda value: value if type(value) is str else str(value)
    if isinstance(field, serializers.MultipleChoiceField):
        return field.to_representation
    if isinstance(field, serializers.ChoiceField):
        choices = field.choice_strings_to_values
        return lambda value: value if value == "" else choices.get(str(value), value)
    if isinstance(
        field, (serializers.DateTimeField, serializers.DateField, serializers.ListField, serializers.DictField)
    ):
        # Context-free: the time zone is the current one at the call, as in DRF.
        return field.to_representation
    raise TypeError(f"{field.field_name}: {type(field).__name__} has no fast row")


def narrow(queryset, *related: str):
    """`queryset` with every column of its own rows but only the `related` columns (e.g.
    "cluster__name") of the rows it selects with them: a list shows a name of the related row,
    and building each related row in full (30 columns of a cluster, a user's, a JSON config)
    cost more than writing the list row. For lists only: a related row read further is loaded
    column by column."""
    own = [field.name for field in queryset.model._meta.concrete_fields]
    return queryset.only(*own, *related)
