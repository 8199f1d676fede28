"""DRF glue: team-scoped roles and related fields, and Django errors as API errors."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.utils import timezone
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers, status, views
from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import APIException, AuthenticationFailed
from rest_framework.response import Response

from apps.accounts import access
from apps.accounts.models import Role
from apps.accounts.services import token_expires_at
from apps.core import errors

# An operation that can answer 409 says so with `extend_schema(responses={409: CONFLICT})`.
CONFLICT = OpenApiResponse(
    description="The object moved on meanwhile, or another operation holds it; nothing was changed."
)


class Conflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"


class ExpiringTokenAuthentication(TokenAuthentication):
    """DRF's token authentication, where a token stops working FLEETDECK_API_TOKEN_TTL_DAYS after
    it was issued. The refusal says how to get a new token, since its holder cannot fix it alone;
    it names no user, since whoever presents an old token may not be its owner."""

    def authenticate_credentials(self, key):
        user, token = super().authenticate_credentials(key)
        expires = token_expires_at(token)
        if expires <= timezone.now():
            raise AuthenticationFailed(
                f"This API token expired on {timezone.localdate(expires):%Y-%m-%d}; ask for a new one with "
                "`make token USER=<username>` or `manage.py create_api_token <username>`."
            )
        return user, token


def require_role(request, team, needed: Role, what: str) -> None:
    access.require(request.user, team, needed, what)


class VisibleRelatedField:
    """A related field that finds only what the requesting user may see: naming another team's
    object is refused exactly like naming one that does not exist. Needs the request in the
    serializer's context."""

    def get_queryset(self):
        request = self.context.get("request")
        return access.visible(getattr(request, "user", None), super().get_queryset())


class VisiblePrimaryKeyRelatedField(VisibleRelatedField, serializers.PrimaryKeyRelatedField):
    pass


class VisibleSlugRelatedField(VisibleRelatedField, serializers.SlugRelatedField):
    def to_internal_value(self, data):
        # PostgreSQL refuses a NUL in any text it is asked to compare: a 400, not a 500 from the query.
        if isinstance(data, str) and "\x00" in data:
            self.fail("does_not_exist", slug_name=self.slug_field, value="(a value with a NUL character)")
        return super().to_internal_value(data)


def as_api_error(exc: DjangoValidationError) -> serializers.ValidationError:
    """A service's refusal, with every message, as a 400 the API client can read."""
    return serializers.ValidationError({"detail": exc.messages})


def exception_handler(exc, context):
    """DRF's handler, with a body over FLEETDECK_MAX_BODY_BYTES answered as the API answers
    everything, in JSON (413 and the limit) rather than Django's HTML 400 page, a domain conflict
    as a 409 with every message, and any other refusal of a service that a viewset lets through as
    a 400 (`as_api_error`), so viewsets need not wrap every service call. DRF's handler marks the
    transaction for rollback, as for its own errors."""
    if isinstance(exc, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return Response(
            {"detail": [f"The request body is too large: the limit is {limit:,} bytes."]},
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    if isinstance(exc, errors.Conflict):
        exc = Conflict({"detail": exc.messages})
    elif isinstance(exc, DjangoValidationError):
        exc = as_api_error(exc)
    response = views.exception_handler(exc, context)
    if response is not None:
        response.data = error_body(response.data)
    return response


def error_body(data) -> dict[str, list[str]]:
    """Every error the API answers in one shape (the OpenAPI schema's `Error`): each field in error,
    by its path in the input (`mix[2].share`, `autoscaling_config.max_replicas`), or `detail` for
    the request as a whole, with a list of messages. DRF's own shapes (a string detail, nested
    dicts and lists, `non_field_errors`) would make a client handle four."""
    out: dict[str, list[str]] = {}
    _flatten(data, "", out)
    return out or {"detail": ["The request was refused."]}


def _flatten(data, path: str, out: dict[str, list[str]]) -> None:
    if isinstance(data, dict):
        for key, value in data.items():
            name = "" if key in ("detail", "non_field_errors") else str(key)
            _flatten(value, f"{path}.{name}" if path and name else path or name, out)
    elif isinstance(data, list) and any(isinstance(item, (dict, list)) for item in data):
        for index, item in enumerate(data):
            _flatten(item, f"{path}[{index}]", out)
    elif isinstance(data, list):
        out.setdefault(path or "detail", []).extend(str(item) for item in data)
    elif data is not None:
        out.setdefault(path or "detail", []).append(str(data))
