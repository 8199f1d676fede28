"""Settings for the test suite: the real settings, production-like (DEBUG off), with a private
folder for the embedded broker so tests never share it with a running local instance."""

import os
import tempfile

os.environ.setdefault("FLEETDECK_ALLOW_DEV_SECRET", "1")
os.environ.setdefault("FLEETDECK_VAR_DIR", tempfile.mkdtemp(prefix="fleetdeck-test-"))
os.environ.setdefault("FLEETDECK_SECURE_COOKIES", "0")
# Fleetdeck calls nothing its allow-list does not cover; the tests' clusters and servers are on loopback.
os.environ.setdefault("FLEETDECK_CLUSTER_NETWORKS", "127.0.0.0/8,::1/128")
# No wait for Ray's metrics export before the closing reading of a change: the tests that measure
# clients set it, on clusters that export every second.
os.environ.setdefault("FLEETDECK_CLIENT_IMPACT_SETTLE_S", "0")

from controlplane.settings import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
STORAGES["staticfiles"]["BACKEND"] = "django.contrib.staticfiles.storage.StaticFilesStorage"  # noqa: F405
WHITENOISE_USE_FINDERS = True
REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"] = {"user": "100000/min", "anon": "100000/min"}  # noqa: F405
# Threads the tests start (a Celery worker, the live server) must not keep connections open,
# or PostgreSQL refuses to drop the test database at the end.
DATABASES["default"]["CONN_MAX_AGE"] = 0  # noqa: F405
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):  # noqa: F405
    # A file, not memory: the crash-recovery test runs a real worker in another process.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test-db.sqlite3")}  # noqa: F405
