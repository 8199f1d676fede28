"""Error answers in the OpenAPI schema. drf-spectacular documents what an operation answers when
it works; the ways any operation can fail (bad input, no credentials, a role that does not allow
it, an object that does not exist or is not yours, throttling) are added here, once, so clients
can rely on every status the API gives being in the schema.

An operation that can also answer 409 says so itself with `extend_schema(responses={409: CONFLICT})`
(`apps.accounts.drf`); this hook gives every documented error the one shape every error has
(`apps.accounts.drf.error_body`)."""

from __future__ import annotations

ERROR = {
    "type": "object",
    "description": (
        "Every error has this shape: each field in error, by its path in the input (`mix[2].share`, "
        "`autoscaling_config.max_replicas`), or `detail` for the request as a whole, with its messages."
    ),
    "additionalProperties": {"type": "array", "items": {"type": "string"}},
    "example": {"detail": ["Change #12 is already in progress on gpu-prod."]},
}
METHODS = {"get", "put", "post", "patch", "delete"}


def _ref(name: str) -> dict:
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}}


def document_errors(result: dict, generator, request, public) -> dict:
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas["Error"] = ERROR
    for operations in result.get("paths", {}).values():
        for method, operation in operations.items():
            if method not in METHODS:
                continue
            responses = operation.setdefault("responses", {})
            common = {
                "401": "No credentials, or a token that is not valid.",
                "403": "Your role in the object's team does not allow this.",
                # Lists too: a page past the last one.
                "404": "No such object, or it belongs to a team you are not a member of.",
                "429": "Too many requests; retry after the time the Retry-After header gives.",
            }
            if method != "get" or any(p.get("in") == "query" for p in operation.get("parameters", [])):
                common["400"] = "The input is not valid, or the request was refused: the body says why."
            if "requestBody" in operation:
                common["415"] = "The body is not in a media type the operation accepts."
            for code, description in common.items():
                responses.setdefault(code, {"description": description})
            for code, response in responses.items():
                if code.isdigit() and int(code) >= 400 and "content" not in response:
                    response["content"] = _ref("Error")
    return result


# Lists whose rows come in forms, a full row or a lean one with a subset of its fields
# (`?view=summary`): a full row is also a valid lean one, so "exactly one of" could never hold.
ROW_FORMS = ("IncidentListItem",)


def rows_in_forms(result: dict, generator, request, public) -> dict:
    schemas = result.get("components", {}).get("schemas", {})
    for name in ROW_FORMS:
        if "oneOf" in schemas.get(name, {}):
            schemas[name]["anyOf"] = schemas[name].pop("oneOf")
    return result
