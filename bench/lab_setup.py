"""The environment the real-cluster benchmarks run Fleetdeck in, then Django: a throwaway SQLite
database and var dir (never the developer's), and loopback allowed, since each benchmark's private
Ray head listens there and the egress allow-list refuses it otherwise. Call before any app import."""

from __future__ import annotations

import os
import tempfile


def setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    os.environ.setdefault("FLEETDECK_DEBUG", "1")
    os.environ.setdefault("FLEETDECK_VAR_DIR", tempfile.mkdtemp(prefix="fleetdeck-bench-"))
    os.environ.pop("DATABASE_URL", None)
    os.environ.setdefault("FLEETDECK_CLUSTER_NETWORKS", "127.0.0.0/8,::1/128")
    import django

    django.setup()
