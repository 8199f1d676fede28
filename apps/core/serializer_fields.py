"""API fields shared by every app's serializers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rest_framework import serializers

from apps.core import redaction


class RedactedJSONField(serializers.JSONField):
    """A stored JSON value as every reader gets it: with what Fleetdeck knows to be secret replaced
    by placeholders (`apps.core.redaction`; a Serve config unless `redact` says otherwise). Read-only
    unless asked: a writable one takes what is sent as it is, and the service puts the values of
    any placeholders back."""

    def __init__(self, redact: Callable[[Any], Any] = redaction.redact_config, **kwargs):
        kwargs.setdefault("read_only", True)
        super().__init__(**kwargs)
        self.redact = redact

    def to_representation(self, value):
        return self.redact(value)
