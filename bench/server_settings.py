"""Production settings plus a trivial DRF endpoint, for bench/ui_api_cost.py's gunicorn only."""

from controlplane.settings import *  # noqa: F403

ROOT_URLCONF = "bench.server_urls"
