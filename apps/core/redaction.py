"""What Fleetdeck knows to be secret in what it stores, replaced on the way out.

Serve configs carry credentials in `runtime_env.env_vars` (HF_TOKEN, cloud keys) and in serve.llm's
`engine_kwargs` (hf_token, api_key); the requests of calibrations and warmups carry HTTP headers.
Fleetdeck keeps the real values, since a push sends the whole cluster's config to Ray (sealed in
the database, apps.core.sealed): every read path (API, pages, diffs, audit entries) shows a copy
made here instead, for every role.

A placeholder carries a short digest of the value, keyed by SECRET_KEY, so a diff of two configs
still shows that a secret changed while nobody can test guesses against it. A config sent back with
placeholders in it gets the values they stand for from the live config (`restore_placeholders`);
one that stands for no value there is refused.

A config, patch or value with nothing to replace comes back as it is, not copied: lists redact
every row they show."""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import re
from collections.abc import Callable
from typing import Any

from django.conf import settings

PLACEHOLDER = re.compile(r"<redacted:[0-9a-f]{8}>")
# Fleetdeck's own recycle counter (apps.maintenance.execution.GENERATION_VAR): no secret, and
# operators read it to tell one recycle from the next.
VISIBLE_ENV_VARS = frozenset({"FLEETDECK_RECYCLE_GENERATION"})
# vLLM's engine arguments that hold credentials.
SECRET_ENGINE_KWARGS = frozenset({"hf_token", "api_key"})
# Headers that say how a body is encoded, never who asks. Any other header may carry a
# credential under a name no list can foresee (X-Org-Token, Api-Key, a signature), so its value
# is redacted.
VISIBLE_HEADERS = frozenset(
    {"accept", "accept-encoding", "accept-language", "content-encoding", "content-type", "user-agent"}
)


class PlaceholderUnmatched(ValueError):
    """A config sent back holds a placeholder that stands for no value Fleetdeck can put back."""


@functools.lru_cache(maxsize=4)
def _key(secret_key: str) -> bytes:
    return hashlib.sha256(b"fleetdeck-redaction:" + secret_key.encode()).digest()


def is_placeholder(value: Any) -> bool:
    return isinstance(value, str) and PLACEHOLDER.fullmatch(value) is not None


def placeholder(value: Any) -> str:
    """`<redacted:…>` with the value's keyed digest; a placeholder stays as it is."""
    if is_placeholder(value):
        return value
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return f"<redacted:{hmac.new(_key(settings.SECRET_KEY), text.encode(), hashlib.sha256).hexdigest()[:8]}>"


def _is_secret_slot(parent: str, key: Any) -> bool:
    """Whether the value under `key` of a mapping held under `parent` is secret."""
    if parent == "env_vars":
        return key not in VISIBLE_ENV_VARS
    if parent == "headers":
        return str(key).lower() not in VISIBLE_HEADERS
    return parent == "engine_kwargs" and key in SECRET_ENGINE_KWARGS


def _redactor(parent: str) -> Callable[[Any], Any]:
    def redact(mapping: Any) -> Any:
        if not isinstance(mapping, dict):
            return mapping
        return {key: placeholder(value) if _is_secret_slot(parent, key) else value for key, value in mapping.items()}

    return redact


redact_env = _redactor("env_vars")
redact_headers = _redactor("headers")
# The mappings whose values may be secret, by the key that holds them.
_CONFIG_SECRETS = {"env_vars": redact_env, "engine_kwargs": _redactor("engine_kwargs")}
_ANY_SECRETS = {**_CONFIG_SECRETS, "headers": redact_headers}


def _walk(value: Any, secrets: dict[str, Callable[[Any], Any]]) -> Any:
    """`value` with every mapping held under a key of `secrets` redacted, at any depth."""
    if isinstance(value, dict):
        out = None
        for key, inner in value.items():
            if isinstance(inner, dict) and key in secrets:
                new = secrets[key](inner)
            elif isinstance(inner, (dict, list)):
                new = _walk(inner, secrets)
            else:
                continue
            if new is not inner:
                out = out if out is not None else dict(value)
                out[key] = new
        return value if out is None else out
    if isinstance(value, list):
        return _each(value, lambda inner: _walk(inner, secrets))
    return value


def _each(items: Any, redact: Callable[[Any], Any]) -> Any:
    if not isinstance(items, list):
        return items
    out = None
    for index, item in enumerate(items):
        new = redact(item)
        if new is not item:
            out = out if out is not None else list(items)
            out[index] = new
    return items if out is None else out


def _each_value(mapping: Any) -> Any:
    if not isinstance(mapping, dict):
        return mapping
    changed = {name: new for name, inner in mapping.items() if (new := redact_config(inner)) is not inner}
    return {**mapping, **changed} if changed else mapping


def _in_config(value: Any) -> Any:
    return _walk(value, _CONFIG_SECRETS)


# Where Serve takes secrets, by the key that leads there. args and user_config are the user's own
# (serve.llm keeps a runtime_env and engine_kwargs in args), so they are searched through.
_PLACES: dict[str, Callable[[Any], Any]] = {
    "applications": lambda apps: _each(apps, redact_config),
    "deployments": lambda deployments: _each(deployments, redact_config),
    "runtime_env": _in_config,
    "env_vars": redact_env,
    "ray_actor_options": lambda options: redact_config(options),
    "args": _in_config,
    "user_config": _in_config,
    # A config revision: the submitted application config, and each deployment's effective one.
    "submitted": lambda submitted: redact_config(submitted),
    "effective": _each_value,
}


def redact_config(config: Any) -> Any:
    """A Serve config with every secret replaced by its placeholder: the whole cluster's, one
    application's, one deployment's entry, options or effective config, a runtime_env, or a config
    revision. Only the places Serve takes secrets are read, so a config without any costs a few
    lookups and comes back as it is."""
    if isinstance(config, list):
        return _each(config, redact_config)
    if not isinstance(config, dict):
        return config
    changed = {}
    for key, redact in _PLACES.items():
        inner = config.get(key)
        if inner is not None and (new := redact(inner)) is not inner:
            changed[key] = new
    return {**config, **changed} if changed else config


def redact_patch(operations: Any) -> Any:
    """An RFC 6902 JSON Patch between two Serve configs with the secrets among its values replaced:
    a value lands on a secret when its path ends at one (`…/env_vars/HF_TOKEN`)."""
    return map_patch_secrets(operations, placeholder)


def map_secrets(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """`value` with `leaf` applied to every secret it holds, wherever an env_vars, engine_kwargs or
    headers mapping sits: how stored configs seal their secrets and open them again (apps.core.sealed)."""
    return _walk(value, {key: _mapper(key, leaf) for key in _ANY_SECRETS})


def map_patch_secrets(operations: Any, leaf: Callable[[Any], Any]) -> Any:
    """`map_secrets` over an RFC 6902 patch: a value whose path ends at a secret is one itself."""

    def apply(operation: Any) -> Any:
        if not isinstance(operation, dict) or "value" not in operation:
            return operation
        value = operation["value"]
        path = [part.replace("~1", "/").replace("~0", "~") for part in str(operation.get("path", "")).split("/")]
        if len(path) >= 2 and _is_secret_slot(path[-2], path[-1]):
            new = leaf(value)
        elif isinstance(value, dict) and path[-1] in _ANY_SECRETS:
            new = _mapper(path[-1], leaf)(value)
        else:
            new = map_secrets(value, leaf)
        return operation if new is value else {**operation, "value": new}

    return _each(operations, apply)


def _mapper(parent: str, leaf: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def apply(mapping: Any) -> Any:
        if not isinstance(mapping, dict):
            return mapping
        changed = {
            key: new
            for key, value in mapping.items()
            if _is_secret_slot(parent, key) and (new := leaf(value)) is not value
        }
        return {**mapping, **changed} if changed else mapping

    return apply


def redact_anywhere(value: Any) -> Any:
    """`value` with every env_vars, engine_kwargs and headers mapping redacted wherever it is: for
    what has no fixed shape, such as an audit entry's changes or a calibration's stored request."""
    return _walk(value, _ANY_SECRETS)


# pydantic quotes the input it refused, cut to its ends (`input_value={'env_vars': {'HF_TOKEN': 'hf_…`),
# and Ray passes its validation errors on as they are.
_QUOTED_INPUT = re.compile(r"input_value=.*?, input_type=")


def redact_quoted_input(message: str) -> str:
    """A validation error's text without the input it quotes: the path and the reason stay."""
    return _QUOTED_INPUT.sub("input_value=<redacted>, input_type=", message)


def secret_values(config: Any) -> dict[tuple[str, str], list[str]]:
    """The secrets a config or a request holds, by where they sit (`("env_vars", "HF_TOKEN")`): what
    placeholders sent back may stand for."""
    found: dict[tuple[str, str], list[str]] = {}

    def collect(value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                if isinstance(inner, dict) and key in _ANY_SECRETS:
                    for name, secret in inner.items():
                        if _is_secret_slot(key, name) and not is_placeholder(secret):
                            found.setdefault((key, name), []).append(secret)
                collect(inner)
        elif isinstance(value, list):
            for inner in value:
                collect(inner)

    collect(config)
    return found


def restore_placeholders(value: Any, known: dict[tuple[str, str], list[str]]) -> Any:
    """`value` (a config or options sent back, perhaps pre-filled from a redacted copy) with each
    placeholder replaced by the value it stands for among `known` (see `secret_values`) at the same
    kind of place. PlaceholderUnmatched names the first that stands for none: the person must type
    that value again."""

    def restore(inner: Any, where: tuple) -> Any:
        if isinstance(inner, dict):
            changed = {key: new for key, item in inner.items() if (new := restore(item, (*where, key))) is not item}
            return {**inner, **changed} if changed else inner
        if isinstance(inner, list):
            changed = {i: new for i, item in enumerate(inner) if (new := restore(item, (*where, i))) is not item}
            return [changed.get(i, item) for i, item in enumerate(inner)] if changed else inner
        if not is_placeholder(inner):
            return inner
        slot = tuple(str(part) for part in where[-2:])
        for candidate in known.get(slot, ()) if len(slot) == 2 else ():
            if placeholder(candidate) == inner:
                return candidate
        raise PlaceholderUnmatched(
            f"{_path_text(where) or 'The value'} holds a redacted placeholder that matches no current value: "
            "type the value again."
        )

    return restore(value, ())


def _path_text(where: tuple) -> str:
    text = ""
    for part in where:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text
