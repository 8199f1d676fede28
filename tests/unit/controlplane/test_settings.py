"""Production settings: refuse an unsafe start, and pass Django's deployment checklist."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SECRET_KEY = "x" * 20 + "-production-secret-with-enough-entropy-1234567890"


def manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETDECK_", "DJANGO_"))}
    clean.update(
        env,
        DJANGO_SETTINGS_MODULE="controlplane.settings",
        FLEETDECK_VAR_DIR=env.get("FLEETDECK_VAR_DIR", "/tmp/fleetdeck-settings-test"),
    )
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=REPO, env=clean, capture_output=True, text=True, timeout=120
    )


def test_production_refuses_to_start_without_a_secret_key():
    result = manage("check")
    assert result.returncode != 0
    assert "FLEETDECK_SECRET_KEY must be set" in result.stderr


def test_production_refuses_to_start_without_an_encryption_key_of_its_own():
    result = manage("check", FLEETDECK_SECRET_KEY=SECRET_KEY)
    assert result.returncode != 0
    assert "FLEETDECK_ENCRYPTION_KEY must be set when FLEETDECK_DEBUG is off" in result.stderr
    assert "secrets.token_urlsafe(50)" in result.stderr and "FLEETDECK_ALLOW_DEV_SECRET=1" in result.stderr


@pytest.mark.parametrize(
    "env",
    [
        {"FLEETDECK_SECRET_KEY": SECRET_KEY, "FLEETDECK_ENCRYPTION_KEY": "k" * 50},
        {"FLEETDECK_SECRET_KEY": SECRET_KEY, "FLEETDECK_ENCRYPTION_KEYS": "n" * 50 + "," + "o" * 50},
        {"FLEETDECK_DEBUG": "1"},
        {"FLEETDECK_ALLOW_DEV_SECRET": "1"},
    ],
    ids=["key", "keys", "debug", "throwaway"],
)
def test_settings_start_with_an_encryption_key_in_debug_or_on_a_throwaway_machine(env):
    result = manage("check", **env)
    assert result.returncode == 0, result.stderr


def test_the_api_token_lifetime_comes_from_the_environment():
    code = "from django.conf import settings; print(settings.FLEETDECK_API_TOKEN_TTL_DAYS)"
    result = manage("shell", "-c", code, FLEETDECK_DEBUG="1", FLEETDECK_API_TOKEN_TTL_DAYS="7")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "7"


def test_a_bad_environment_value_is_refused_with_its_name():
    result = manage("check", FLEETDECK_DEBUG="1", FLEETDECK_SYNC_INTERVAL_S="soon")
    assert result.returncode != 0
    assert "FLEETDECK_SYNC_INTERVAL_S='soon' is not valid" in result.stderr


def test_a_too_small_interval_is_refused():
    result = manage("check", FLEETDECK_DEBUG="1", FLEETDECK_SYNC_INTERVAL_S="1")
    assert result.returncode != 0
    assert "must be at least 5" in result.stderr


# Django's deployment checks in a process of their own: `make test` runs it, `make check` does not.
@pytest.mark.slow
def test_the_deployment_checklist_is_clean_in_production_settings():
    result = manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        FLEETDECK_SECRET_KEY=SECRET_KEY,
        FLEETDECK_ENCRYPTION_KEY="k" * 50,
        FLEETDECK_SSL_REDIRECT="1",
        FLEETDECK_HSTS_SECONDS="31536000",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout
