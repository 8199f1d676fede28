"""Fleetdeck settings: everything comes from the environment, with embedded defaults that make a
fresh machine work (SQLite for the database and the broker, under ./var)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import dj_database_url
from csp.constants import NONCE, NONE, SELF, UNSAFE_INLINE
from django.core.exceptions import ImproperlyConfigured
from kombu import Queue

from controlplane.env import env_bool, env_float, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("FLEETDECK_VAR_DIR", str(BASE_DIR / "var")))

DEBUG = env_bool("FLEETDECK_DEBUG", False)
_ALLOW_DEV_SECRET = env_bool("FLEETDECK_ALLOW_DEV_SECRET", False)
_DEV_SECRET = "fleetdeck-development-only-secret-key-do-not-use-in-production"
SECRET_KEY = env_str("FLEETDECK_SECRET_KEY", _DEV_SECRET)
if not DEBUG and SECRET_KEY == _DEV_SECRET and not _ALLOW_DEV_SECRET:
    raise ImproperlyConfigured(
        "FLEETDECK_SECRET_KEY must be set when FLEETDECK_DEBUG is off "
        "(or set FLEETDECK_ALLOW_DEV_SECRET=1 on a throwaway machine)."
    )
# Credentials at rest are encrypted with the first of these keys; all of them decrypt, so a key
# is rotated by putting the new one first, running `manage.py rotate_secrets`, then dropping the
# old one (docs/configuration.md). A single FLEETDECK_ENCRYPTION_KEY is the one-key form.
FLEETDECK_ENCRYPTION_KEY = env_str("FLEETDECK_ENCRYPTION_KEY", "")
FLEETDECK_ENCRYPTION_KEYS = env_list(
    "FLEETDECK_ENCRYPTION_KEYS", [FLEETDECK_ENCRYPTION_KEY] if FLEETDECK_ENCRYPTION_KEY else []
)
# Without a key, apps.core.secrets derives one from SECRET_KEY, and whoever has the secret key
# reads every stored credential: production needs a key of its own.
if not DEBUG and not FLEETDECK_ENCRYPTION_KEYS and not _ALLOW_DEV_SECRET:
    raise ImproperlyConfigured(
        "FLEETDECK_ENCRYPTION_KEY must be set when FLEETDECK_DEBUG is off, to a key of its own: generate one with "
        "`python3 -c 'import secrets; print(secrets.token_urlsafe(50))'` and set it in the environment (in "
        "Kubernetes, as the FLEETDECK_ENCRYPTION_KEY key of the fleetdeck-secrets Secret), or set "
        "FLEETDECK_ALLOW_DEV_SECRET=1 on a throwaway machine. Credentials stored under the key derived from the "
        "secret key stay readable: see 'Rotating the encryption key' in docs/configuration.md."
    )

ALLOWED_HOSTS = env_list("FLEETDECK_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("FLEETDECK_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "csp",
    "axes",
    "apps.core",
    "apps.accounts",
    "apps.clusters",
    "apps.fleet",
    "apps.changes",
    "apps.maintenance",
    "apps.incidents",
    "apps.remediation",
    "apps.scaler",
    "apps.calibration",
    "apps.kubernetes",
    "apps.liveness",
    "apps.demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, as django-axes requires: it turns a locked-out login into its lockout response.
    "axes.middleware.AxesMiddleware",
]

# django-axes counts failed logins per username and address and locks that pair out for a while.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]

ROOT_URLCONF = "controlplane.urls"
WSGI_APPLICATION = "controlplane.wsgi.application"
ASGI_APPLICATION = "controlplane.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "apps.liveness.context_processors.liveness",
            ],
        },
    },
]

_DATABASE_URL = env_str("DATABASE_URL", "")
# Beat keeps its schedule here whatever the database: without the folder it cannot start.
VAR_DIR.mkdir(parents=True, exist_ok=True)
DATABASES = {
    "default": dj_database_url.parse(
        _DATABASE_URL or f"sqlite:///{VAR_DIR / 'fleetdeck.sqlite3'}",
        conn_max_age=env_int("FLEETDECK_DB_CONN_MAX_AGE", 60, minimum=0),
    )
}
if DATABASES["default"]["ENGINE"].endswith("postgresql") and env_bool("FLEETDECK_DB_PREPARED_STATEMENTS", True):
    # A list's queries join four to six tables, and PostgreSQL spent more CPU planning them than
    # running them (a changes page: 2.8 ms of planning for 0.7 ms of execution). A statement a
    # connection has run 5 times is prepared, and PostgreSQL soon settles on a generic
    # plan it no longer re-plans. Off behind a pooler in transaction mode, where a statement
    # prepared on one server connection is not there on the next.
    DATABASES["default"].setdefault("OPTIONS", {}).update(server_side_binding=True, prepare_threshold=5)
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # The web process, the worker and beat share one file: wait for locks instead of failing.
    # IMMEDIATE takes the write lock when a transaction begins: a deferred one that read first
    # (a sync's row lock is a plain SELECT here) fails at once with "database is locked" when it
    # tries to write while another process writes, without waiting.
    DATABASES["default"].setdefault("OPTIONS", {}).update(timeout=20, transaction_mode="IMMEDIATE")
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "fleet:overview"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("FLEETDECK_TIME_ZONE", "UTC")
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env_str("FLEETDECK_STATIC_ROOT", str(BASE_DIR / "staticfiles")))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}
WHITENOISE_USE_FINDERS = DEBUG

# Request bodies above this are refused before a view sees them.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("FLEETDECK_MAX_BODY_BYTES", 1_048_576, minimum=1024)

# Behind the TLS proxy, one hop of X-Forwarded-For is the proxy's word; anything before it is the
# client's, and proves nothing. Audit, login lockout and API throttling all read the address so.
FLEETDECK_PROXY_COUNT = 1 if env_bool("FLEETDECK_BEHIND_TLS_PROXY", False) else 0
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if FLEETDECK_PROXY_COUNT else None
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env_bool("FLEETDECK_SECURE_COOKIES", not DEBUG)
SECURE_SSL_REDIRECT = env_bool("FLEETDECK_SSL_REDIRECT", False)
SECURE_HSTS_SECONDS = env_int("FLEETDECK_HSTS_SECONDS", 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("FLEETDECK_HSTS_INCLUDE_SUBDOMAINS", SECURE_HSTS_SECONDS > 0)
SECURE_HSTS_PRELOAD = env_bool("FLEETDECK_HSTS_PRELOAD", SECURE_HSTS_SECONDS > 0)
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"

# Scripts only from this server: pages keep their code in static/js, and htmx gives a script in a
# swapped fragment no nonce (templates/base.html). A nonce joins the policy only for a page that
# gives one to an inline script (`request.csp_nonce`), which none does. htmx works from
# attributes, so it needs no eval. Inline style attributes stay allowed: they cannot run code.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF, NONCE],
        "style-src": [SELF, UNSAFE_INLINE],
        "img-src": [SELF, "data:"],
        "font-src": [SELF, "data:"],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}

AXES_FAILURE_LIMIT = env_int("FLEETDECK_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("FLEETDECK_LOGIN_LOCKOUT_MIN", 15, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_CLIENT_IP_CALLABLE = "apps.accounts.audit.client_ip"

# An API token stops working this many days after it was issued, so a leaked one does not open
# the API for ever; the expiry is counted from the token's creation, and applies to every token.
FLEETDECK_API_TOKEN_TTL_DAYS = env_int("FLEETDECK_API_TOKEN_TTL_DAYS", 90, minimum=1)
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "apps.accounts.drf.ExpiringTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": [
        "controlplane.api.renderers.FastJSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "DEFAULT_PAGINATION_CLASS": "controlplane.api.pagination.CappedCountPagination",
    "PAGE_SIZE": env_int("FLEETDECK_API_PAGE_SIZE", 50, minimum=1),
    "DEFAULT_FILTER_BACKENDS": [
        "apps.accounts.filters.FilterBackend",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_VERSIONING_CLASS": "controlplane.api.versioning.APIVersioning",
    "EXCEPTION_HANDLER": "apps.accounts.drf.exception_handler",
    "DEFAULT_THROTTLE_CLASSES": [
        "rest_framework.throttling.UserRateThrottle",
        "rest_framework.throttling.AnonRateThrottle",
    ],
    "NUM_PROXIES": FLEETDECK_PROXY_COUNT,
    "DEFAULT_THROTTLE_RATES": {
        "user": env_str("FLEETDECK_API_THROTTLE_USER", "1200/min"),
        "anon": env_str("FLEETDECK_API_THROTTLE_ANON", "60/min"),
    },
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Fleetdeck API",
    "DESCRIPTION": "Control plane for Ray Serve fleets: clusters, inventory and configuration history.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "controlplane.api.openapi.document_errors",
        "controlplane.api.openapi.rows_in_forms",
    ],
    "ENUM_NAME_OVERRIDES": {
        "ChangeStateEnum": "apps.changes.models.ChangeState",
        "RolloutStateEnum": "apps.changes.models.Rollout.State",
        "MaintenanceRunStateEnum": "apps.maintenance.models.MaintenanceRun.State",
        "IncidentStatusEnum": "apps.incidents.models.Incident.Status",
        "IncidentKindEnum": "apps.incidents.models.Incident.Kind",
        "KubeResourceKindEnum": "apps.kubernetes.models.KubeLink.Kind",
    },
}

CACHES = {
    "default": (
        {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": env_str("FLEETDECK_CACHE_URL")}
        if env_str("FLEETDECK_CACHE_URL")
        else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    )
}

# Celery. The embedded default is a broker that needs no server: kombu's SQLAlchemy transport on a
# SQLite file, which writes each message in a transaction, hardened by controlplane/broker.py.
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", f"sqla+sqlite:///{VAR_DIR / 'broker.sqlite3'}")
_SQL_BROKER = CELERY_BROKER_URL.startswith(("sqla+", "sqlalchemy+"))
if _SQL_BROKER:
    # A transport named in the URL wins over this setting, so the name goes and the rest is the
    # database URL the transport opens.
    CELERY_BROKER_URL = CELERY_BROKER_URL.split("+", 1)[1]
    CELERY_BROKER_TRANSPORT = "controlplane.broker:Transport"
# The SQLAlchemy transport hands its options to create_engine(); the visibility timeout, below, is
# for the others.
CELERY_BROKER_TRANSPORT_OPTIONS = {}
# A task message Celery cannot read is logged and dropped instead of ending the worker.
CELERY_WORKER_CONSUMER = "controlplane.celery:TolerantConsumer"
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
# The UI reads our own rows, never Celery results.
CELERY_TASK_IGNORE_RESULT = True
# Acknowledged on receipt by default. Tasks that are safe to run twice (sync, tick, polls, the
# reconciler) ask for late acknowledgement themselves, so a worker killed mid-task has them
# redelivered; changes and maintenance runs persist every step instead, and the reconciler
# finishes what a dead worker left; a webhook delivered twice would notify twice.
CELERY_TASK_ACKS_LATE = False
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ALWAYS_EAGER = env_bool("FLEETDECK_TASKS_EAGER", False)
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
# Work that waits goes to queues of its own, so it never holds the slots syncs and the tick need:
# a change or a maintenance run waits on Ray for minutes ("long"), a metrics reading for as long as
# its endpoint's deadline ("metrics"), and the tick, every team's periodic work, waits behind
# nothing ("tick"). A worker started without -Q consumes all four; the deployment runs the long
# queue in processes of their own (deploy/k8s/worker.yaml, `make run`).
CELERY_TASK_DEFAULT_QUEUE = "celery"
CELERY_TASK_QUEUES = [Queue(name) for name in ("celery", "tick", "metrics", "long")]
CELERY_TASK_ROUTES = {
    "fleet.tick": {"queue": "tick"},
    "incidents.collect_metrics": {"queue": "metrics"},
    "changes.run": {"queue": "long"},
    "maintenance.run": {"queue": "long"},
}

# Fleet behaviour.
FLEETDECK_SYNC_INTERVAL_S = env_int("FLEETDECK_SYNC_INTERVAL_S", 30, minimum=5)
# Clusters per sync task, whose dashboards one worker process reads at once (at most
# FLEETDECK_SYNC_CONCURRENCY at a time): large enough that a few hung dashboards overlap.
FLEETDECK_SYNC_BATCH = env_int("FLEETDECK_SYNC_BATCH", 500, minimum=1)
FLEETDECK_SYNC_CONCURRENCY = env_int("FLEETDECK_SYNC_CONCURRENCY", 500, minimum=1)
FLEETDECK_TICK_INTERVAL_S = env_int("FLEETDECK_TICK_INTERVAL_S", 10, minimum=1)
FLEETDECK_RAY_TIMEOUT_S = env_float("FLEETDECK_RAY_TIMEOUT_S", 5.0, minimum=0.1)
# The most of one answer any outside server (dashboard, metrics, Prometheus, Serve, webhook) may
# send, and for how long from the request's start: per-read timeouts alone let a server that sends
# a byte every few seconds, or never stops, hold a worker (integrations/egress.py).
FLEETDECK_OUTBOUND_MAX_BYTES = env_int("FLEETDECK_OUTBOUND_MAX_BYTES", 64 * 2**20, minimum=2**20)
FLEETDECK_OUTBOUND_DEADLINE_S = env_float("FLEETDECK_OUTBOUND_DEADLINE_S", 30.0, minimum=1.0)
# A metrics reading (a scrape, or Prometheus's queries) runs as its own task, stopped by Celery
# after this long: above one answer's deadline, so a slow endpoint is named by the transport first.
FLEETDECK_METRICS_TIME_LIMIT_S = env_int("FLEETDECK_METRICS_TIME_LIMIT_S", 45, minimum=5)
# A replica Ray has not started after this long is "waiting": the sync reads the nodes' free
# resources and the findings say what is missing. Serve starts a replica in seconds when a node
# has room (measured ~3 s), so a minute means it has none.
FLEETDECK_WAITING_REPLICA_S = env_int("FLEETDECK_WAITING_REPLICA_S", 60, minimum=1)
# How old the nodes' resources may be before a sync reads them again while nothing waits: they
# change with nodes, not with requests.
FLEETDECK_NODE_RESOURCES_MAX_AGE_S = env_int("FLEETDECK_NODE_RESOURCES_MAX_AGE_S", 300, minimum=5)
# Replica-count samples (the scaling chart) older than this are deleted by the tick.
FLEETDECK_SCALING_HISTORY_DAYS = env_int("FLEETDECK_SCALING_HISTORY_DAYS", 30, minimum=1)
# Config revisions older than this go, except each application's newest 20 (apps/fleet/retention.py).
FLEETDECK_REVISION_RETENTION_DAYS = env_int("FLEETDECK_REVISION_RETENTION_DAYS", 90, minimum=1)
# Change step logs older than this go, except those of each cluster's newest 50 changes (apps/changes/retention.py).
FLEETDECK_CHANGE_LOG_RETENTION_DAYS = env_int("FLEETDECK_CHANGE_LOG_RETENTION_DAYS", 180, minimum=1)
# Audit rows older than this go (apps/accounts/retention.py).
FLEETDECK_AUDIT_RETENTION_DAYS = env_int("FLEETDECK_AUDIT_RETENTION_DAYS", 365, minimum=1)
# Scaler decisions older than this are deleted by the tick, a thousand at a time (apps/scaler/retention.py).
FLEETDECK_SCALER_DECISION_DAYS = env_int("FLEETDECK_SCALER_DECISION_DAYS", 14, minimum=1)
# Comma-separated CIDRs every team's URLs may point into, beside the allow-list administrators keep
# (apps/clusters/network_policy.py). Nothing listed in either allows nothing: Fleetdeck fails closed.
# Link-local addresses (cloud metadata services) are always refused.
FLEETDECK_CLUSTER_NETWORKS = env_list("FLEETDECK_CLUSTER_NETWORKS", [])
FLEETDECK_UI_REFRESH_S = env_int("FLEETDECK_UI_REFRESH_S", 5, minimum=1)
# Where people reach this Fleetdeck (e.g. https://fleetdeck.example.com): links in Slack messages and
# Alertmanager alerts point there. Unset, they carry no link.
FLEETDECK_BASE_URL = env_str("FLEETDECK_BASE_URL", "").rstrip("/")
# How often an open incident's alert is sent again to an Alertmanager, which resolves an alert nobody
# re-sends after its resolve_timeout (5 min by default).
FLEETDECK_ALERTMANAGER_RESEND_S = env_int("FLEETDECK_ALERTMANAGER_RESEND_S", 60, minimum=10)
# The bearer token Prometheus scrapes /metrics with; unset, the endpoint answers 404 (controlplane/metrics.py).
FLEETDECK_METRICS_TOKEN = env_str("FLEETDECK_METRICS_TOKEN", "")
# The push protocol: how long a change may take to verify, how often it polls, and after how
# long without a heartbeat the reconciler takes over a change whose worker died.
FLEETDECK_CHANGE_VERIFY_TIMEOUT_S = env_int("FLEETDECK_CHANGE_VERIFY_TIMEOUT_S", 180, minimum=5)
FLEETDECK_CHANGE_POLL_S = env_float("FLEETDECK_CHANGE_POLL_S", 0.5, minimum=0.05)
FLEETDECK_CHANGE_STALE_S = env_int("FLEETDECK_CHANGE_STALE_S", 60, minimum=5)
# What clients saw during a change is read from the proxy's counters once the change ends, after
# Ray's metrics export interval (`metrics_report_interval_ms`, 10 s by default) has passed.
FLEETDECK_CLIENT_IMPACT_SETTLE_S = env_float("FLEETDECK_CLIENT_IMPACT_SETTLE_S", 12.0, minimum=0.0)
if not _SQL_BROKER:
    # Redis hands an unacknowledged task to another worker after this long: well above the longest
    # late-acknowledged task (the reconciler may verify a change, then its rollback), or a slow
    # task would run twice.
    CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"] = max(3600, 2 * FLEETDECK_CHANGE_VERIFY_TIMEOUT_S + 600)
# A surge recycle needs this much free memory per replica it starts, unless the deployment
# declares its own `ray_actor_options.memory`.
# An incident with no new signal for this long resolves itself.
FLEETDECK_INCIDENT_QUIET_S = env_int("FLEETDECK_INCIDENT_QUIET_S", 1800, minimum=60)
FLEETDECK_RECYCLE_REPLICA_MEMORY_MB = env_int("FLEETDECK_RECYCLE_REPLICA_MEMORY_MB", 1024, minimum=1)
# Memory calibrations run as Ray jobs with this interpreter (the cluster's, which has Ray and the
# application's code); past the timeout the job is stopped and the calibration fails.
FLEETDECK_CALIBRATION_PYTHON = env_str("FLEETDECK_CALIBRATION_PYTHON", "python")
FLEETDECK_CALIBRATION_TIMEOUT_S = env_int("FLEETDECK_CALIBRATION_TIMEOUT_S", 900, minimum=30)
FLEETDECK_CALIBRATION_POLL_S = env_float("FLEETDECK_CALIBRATION_POLL_S", 2.0, minimum=0.2)
# Kubernetes API calls: one attempt each within the timeout; lists page through `continue`
# tokens and stop at the cap, marking the result partial rather than reading a huge cluster whole.
FLEETDECK_KUBE_TIMEOUT_S = env_float("FLEETDECK_KUBE_TIMEOUT_S", 10.0, minimum=0.5)
FLEETDECK_KUBE_PAGE_SIZE = env_int("FLEETDECK_KUBE_PAGE_SIZE", 500, minimum=1)
FLEETDECK_KUBE_MAX_ITEMS = env_int("FLEETDECK_KUBE_MAX_ITEMS", 5000, minimum=1)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("FLEETDECK_LOG_LEVEL", "INFO")},
    # One line per Ray request drowns everything else; the adapter reports failures itself.
    # Failed logins are in the audit log already; axes would add a line for each.
    "loggers": {"httpx": {"level": "WARNING"}, "httpcore": {"level": "WARNING"}, "axes": {"level": "WARNING"}},
}
