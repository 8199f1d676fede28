"""`make token USER=…`, the README's way to get an API token next to `make run`: it runs
create_api_token under make run's development settings, where manage.py alone refuses to start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Runs `make` and manage.py as processes: `make test` runs it, `make check` does not.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]


def shell(*args: str, var_dir: Path, **env: str) -> subprocess.CompletedProcess:
    # As make run on a fresh machine: the embedded defaults under var_dir, never the database or
    # broker the suite itself was pointed at (CI's PostgreSQL `test` kept the user between runs).
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FLEETDECK_", "DJANGO_", "MAKE", "DATABASE_URL", "CELERY_"))
    }
    clean.update(env, DJANGO_SETTINGS_MODULE="controlplane.settings", FLEETDECK_VAR_DIR=str(var_dir))
    return subprocess.run(list(args), cwd=REPO, env=clean, capture_output=True, text=True, timeout=300)


def test_make_token_prints_a_working_token_where_manage_py_alone_refuses(tmp_path):
    dev = {"FLEETDECK_DEBUG": "1"}
    assert shell(sys.executable, "manage.py", "migrate", "--noinput", var_dir=tmp_path, **dev).returncode == 0
    created = shell(
        sys.executable,
        "manage.py",
        "shell",
        "-c",
        "from django.contrib.auth.models import User; User.objects.create_user('alice', password='pw')",
        var_dir=tmp_path,
        **dev,
    )
    assert created.returncode == 0, created.stderr

    bare = shell(sys.executable, "manage.py", "create_api_token", "alice", var_dir=tmp_path)
    assert bare.returncode != 0 and "FLEETDECK_SECRET_KEY must be set" in bare.stderr

    made = shell("make", "token", "USER=alice", f"VENV={Path(sys.executable).parents[1]}", var_dir=tmp_path)
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert len(token.split()) == 1 and len(token) >= 20
    assert "This token expires on " in made.stderr
    check = shell(
        sys.executable,
        "manage.py",
        "shell",
        "-c",
        f"from rest_framework.authtoken.models import Token; print(Token.objects.get(key='{token}').user.username)",
        var_dir=tmp_path,
        **dev,
    )
    assert check.stdout.strip().splitlines()[-1] == "alice", check.stderr


def test_make_token_without_a_user_says_how_to_call_it(tmp_path):
    result = shell("make", "token", var_dir=tmp_path)
    assert result.returncode != 0 and "Usage: make token USER=<username>" in result.stderr
