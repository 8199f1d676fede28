"""Long-lived processes freeze the heap they loaded, so the collector stops walking it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from celery.signals import worker_init, worker_process_init

from controlplane import celery, heap

REPO = Path(__file__).resolve().parents[3]


def test_the_wsgi_application_freezes_django_and_every_view_it_loaded():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETDECK_", "DJANGO_"))}
    env.update(FLEETDECK_DEBUG="1", FLEETDECK_VAR_DIR="/tmp/fleetdeck-heap-test")
    code = (
        "import gc, sys; import controlplane.wsgi; "
        "print(gc.get_freeze_count(), 'apps.incidents.api' in sys.modules, 'rest_framework.viewsets' in sys.modules, "
        "gc.get_threshold()[0])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    frozen, views, drf, young = result.stdout.split()
    assert int(frozen) > 50_000 and views == drf == "True", result.stderr[-2000:]
    assert int(young) == heap.YOUNG_THRESHOLD


def test_the_worker_freezes_before_its_pool_forks_and_in_each_pool_process():
    assert celery._freeze_before_the_pool_forks in [ref() for _, ref in worker_init.receivers]
    assert celery._freeze_in_each_pool_process in [ref() for _, ref in worker_process_init.receivers]
