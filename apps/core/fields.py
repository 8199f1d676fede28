"""Model fields shared by every app."""

from __future__ import annotations

import orjson
from django.db import models

# orjson reads an integer past 64 bits as a float; a value with a run of digits that long is
# left to `json.loads`, which keeps it exact. Found by mapping every digit to "0" and looking for
# the run: a regular expression (`\d{19}`) scanned a Serve config six times slower than orjson
# parsed it, and was most of a deployments page's decoding.
DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
LONG_RUN = b"0" * 19


def has_long_number(text: str) -> bool:
    return LONG_RUN in text.encode().translate(DIGITS_AS_ZERO)


class JSONField(models.JSONField):
    """Django's JSONField, decoded by orjson: a list page reads hundreds of JSON values (each
    deployment's Serve configs, an incident's evidence), and `json.loads` was a sixth of a
    deployments page's time. What orjson refuses or reads differently (NaN, which SQLite can hold;
    an integer past 64 bits) and a custom decoder go through Django's own path. The column and the migrations are
    Django's JSONField: `deconstruct` names it, so swapping the class wrote no migration."""

    def from_db_value(self, value, expression, connection):
        if type(value) is str and self.decoder is None and not has_long_number(value):
            try:
                return orjson.loads(value)
            except orjson.JSONDecodeError:
                pass
        return super().from_db_value(value, expression, connection)

    def deconstruct(self):
        name, _, args, kwargs = super().deconstruct()
        return name, "django.db.models.JSONField", args, kwargs
