"""The API's orjson renderer writes the bytes DRF's JSONRenderer writes."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal

import pytest
from django.utils.translation import gettext_lazy
from rest_framework.renderers import JSONRenderer
from rest_framework.utils.serializer_helpers import ReturnDict, ReturnList

from controlplane.api.renderers import FastJSONRenderer


@dataclass
class Point:
    x: int


DOCUMENT = {
    "count": 3,
    "count_capped": False,
    "next": None,
    "results": ReturnList(
        [
            ReturnDict({"id": 1, "name": "ünïcode ✓", "ratio": 0.1, "big": 2**62, "tags": ("a", "b")}, serializer=None),
            {"at": datetime(2026, 12, 3, 11, 30, 40, 123456, tzinfo=UTC), "naive": datetime(2026, 1, 2, 3, 4, 5)},
            {"day": date(2026, 12, 3), "clock": time(1, 2, 3, 456789), "span": timedelta(seconds=90)},
            {"price": Decimal("1.10"), "uuid": uuid.UUID(int=7), "lazy": gettext_lazy("Cluster"), 5: "int key"},
            {"separators": "line\u2028paragraph\u2029end", "nested": [[{"deep": True}]]},
        ],
        serializer=None,
    ),
}


def test_the_same_bytes_as_drf():
    assert FastJSONRenderer().render(DOCUMENT) == JSONRenderer().render(DOCUMENT)


def test_what_orjson_refuses_and_pretty_printing_are_written_by_drf():
    huge = {"bytes": 2**70}
    assert FastJSONRenderer().render(huge) == JSONRenderer().render(huge) == b'{"bytes":1180591620717411303424}'
    indented = FastJSONRenderer().render({"a": [1]}, "application/json; indent=2")
    assert indented == JSONRenderer().render({"a": [1]}, "application/json; indent=2")
    assert b"\n" in indented


def test_what_drf_cannot_write_fails_as_it_did():
    for renderer in (FastJSONRenderer(), JSONRenderer()):
        with pytest.raises(TypeError, match="Point is not JSON serializable"):
            renderer.render({"point": Point(1)})


def test_nothing_is_nothing_and_nan_is_null():
    assert FastJSONRenderer().render(None) == b""
    assert FastJSONRenderer().render({"p99": float("nan")}) == b'{"p99":null}'
