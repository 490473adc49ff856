"""Django settings, read from the environment through :mod:`inference_service.env`.

Embedded defaults (no variables set): SQLite under ``var/``, Redis on localhost DB 0, the locally
built model under ``var/models/tiny``. ``DATABASE_URL``/``REDIS_URL``/``MODEL_PATH`` switch to real
deployments.
"""

from __future__ import annotations

from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from inference_service.env import env_bool, env_float, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"

DEBUG = env_bool("DEBUG", False)
# The embedded default is for a developer machine; production sets SECRET_KEY.
SECRET_KEY = env_str("SECRET_KEY", "insecure-dev-key-set-SECRET_KEY-in-production")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "channels",
    "api",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "inference_service.urls"
WSGI_APPLICATION = None
ASGI_APPLICATION = "inference_service.asgi.application"

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
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'db.sqlite3'}"),
        # Persistent connections and ASGI threads do not mix well; 0 closes per request.
        conn_max_age=env_int("DB_CONN_MAX_AGE", 0, minimum=0),
        # A persistent connection (DB_CONN_MAX_AGE) is checked at its first use in each request,
        # so one the server dropped (a restart, pg_terminate_backend, a proxy's idle timeout) is
        # replaced instead of failing that request. Pooled connections: see DB_POOL below.
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The embedded default has several writer processes (daphne, the engine worker, the light
    # Celery worker): WAL lets readers and one writer proceed together, IMMEDIATE transactions
    # take the write lock up front (no lock-upgrade deadlock), and writers wait up to 20 s for it
    # instead of failing with "database is locked".
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        timeout=20,
        transaction_mode="IMMEDIATE",
        init_command="PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    )
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" and env_bool("DB_POOL", False):
    # For the web process (daphne): Django runs each sync view on a thread of its own, so
    # CONN_MAX_AGE cannot keep connections; without a pool every request opens one (a PostgreSQL
    # backend start: ~8 ms of server CPU, the largest single cost of a POST /api/v1/jobs). With
    # psycopg's pool (needs psycopg[pool]) a request borrows an open connection and returns it.
    # Long-running processes (the engine worker) keep persistent connections instead: leave
    # DB_POOL off for them (Django refuses a pool together with CONN_MAX_AGE != 0).
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    # Django's health checks would make the pool check each connection it lends, and psycopg's
    # pool waits 1, 2, 4 s... between failed checks: after pg_terminate_backend on its idle
    # connections, a lone request waited 10 s for a 503 and the next one 7 s. Instead a request
    # that meets a dead connection is a 503 at once (api/errors.py), which also has the pool's
    # idle connections checked, so their loss fails no other request.
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = False
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": env_int("DB_POOL_MIN_SIZE", 2, minimum=0),
        "max_size": env_int("DB_POOL_MAX_SIZE", 20, minimum=1),
        "timeout": env_float("DB_POOL_TIMEOUT_S", 10.0, minimum=0.1),
    }
# Lets concurrent test runs against one server use separate test databases.
if env_str("TEST_DATABASE_NAME", ""):
    DATABASES["default"]["TEST"] = {"NAME": env_str("TEST_DATABASE_NAME", "")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "inference_service.channel_layer.CancelSafeRedisChannelLayer",  # see its docstring
        # redis-py 8 defaults every socket to a 5 s timeout, the same as channels_redis's blocking
        # wait for a consumer's next message (BZPOPMIN 5 s): a WebSocket quiet for 5 s then died
        # with "Timeout reading". The socket must outlive the wait.
        # capacity: channels_redis bounds each channel's queue, and the consumers of one daphne
        # process share ONE queue (process-local channels), so the default of 100 was the backlog
        # of a whole process: 32 streams falling three steps behind dropped messages, finals
        # included, and clients waited 1-2 s for the relay's idle check to recover them.
        "CONFIG": {
            "hosts": [{"address": REDIS_URL, "socket_timeout": 30}],
            "capacity": env_int("CHANNEL_LAYER_CAPACITY", 10_000, minimum=100),
        },
    }
}

CELERY_BROKER_URL = REDIS_URL
# kombu's Redis transport with one client per channel (inference_service/broker.py): less CPU per
# message, but no end-to-end gain measured yet, so off unless asked for.
if env_bool("BROKER_SHARED_CLIENT", False) and REDIS_URL.startswith(("redis://", "rediss://")):
    CELERY_BROKER_TRANSPORT = "inference_service.broker:Transport"
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
# A message is acknowledged after its task ran. run_job only queues the id for the worker's
# admission thread, so a job can be acked and not yet claimed; the DB row (still queued) and the
# reconciler make the final call on whether it runs.
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
# daphne has no static file handling; asgi.py serves them when this is on (embedded default).
SERVE_STATIC = env_bool("SERVE_STATIC", True)

# GET /metrics (Prometheus): the bearer token a scraper sends; staff sessions can read it too.
METRICS_TOKEN = env_str("METRICS_TOKEN", "")

LOGIN_URL = "/admin/login/"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["api.authentication.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["api.parsers.StrictJSONParser"],
    "EXCEPTION_HANDLER": "api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "MLX inference service",
    "DESCRIPTION": "Text-generation jobs over REST and WebSocket, authenticated with API keys.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "api.schema_hooks.add_job_events",
                           "api.schema_hooks.add_job_create_rules",
                           "api.openai_api.schema.add_openai_completions"],
}

# The model the web side tokenizes for (the engine worker loads the same folder).
MODEL_PATH = env_str("MODEL_PATH", str(VAR_DIR / "models" / "tiny"))

# Request limits. MAX_TOKENS_CAP bounds every job; a key's max_tokens_per_job may lower it.
MAX_TOKENS_CAP = env_int("MAX_TOKENS_CAP", 4096, minimum=1)
DEFAULT_MAX_TOKENS = env_int("DEFAULT_MAX_TOKENS", 256, minimum=1)
MAX_PROMPT_CHARS = env_int("MAX_PROMPT_CHARS", 200_000, minimum=1)
MAX_REQUEST_BYTES = env_int("MAX_REQUEST_BYTES", 4 * 1024 * 1024, minimum=1024)
JOBS_PAGE_SIZE = env_int("JOBS_PAGE_SIZE", 20, minimum=1)

# Quotas given to new API keys (each key can be edited in the admin).
DEFAULT_KEY_REQUESTS_PER_MINUTE = env_int("DEFAULT_KEY_REQUESTS_PER_MINUTE", 600, minimum=0)
DEFAULT_KEY_TOKENS_PER_DAY = env_int("DEFAULT_KEY_TOKENS_PER_DAY", 10_000_000, minimum=0)
DEFAULT_KEY_MAX_CONCURRENT_JOBS = env_int("DEFAULT_KEY_MAX_CONCURRENT_JOBS", 64, minimum=0)
DEFAULT_KEY_MAX_TOKENS_PER_JOB = env_int("DEFAULT_KEY_MAX_TOKENS_PER_JOB", MAX_TOKENS_CAP, minimum=1)

# Jobs queued longer than this are expired by the expiry task; running jobs' worker leases last
# this long without a heartbeat before the reconciler re-dispatches them.
JOB_QUEUE_TIMEOUT_S = env_int("JOB_QUEUE_TIMEOUT_S", 3600, minimum=1)
JOB_LEASE_S = env_float("JOB_LEASE_S", 30.0, minimum=1.0)
# Finished jobs' rows are deleted this many days after they ended (0: kept). At least 2, so the
# quotas and the usage roll-up never lose rows they still read (api/services/job_deletion.py).
JOB_RETENTION_DAYS = env_int("JOB_RETENTION_DAYS", 0, minimum=0)
if 0 < JOB_RETENTION_DAYS < 2:
    raise ImproperlyConfigured(f"JOB_RETENTION_DAYS={JOB_RETENTION_DAYS} must be 0 (keep every job) or >= 2")
# New jobs are published to the engine queue from one thread per web process, after the answer
# (up to 8 ids per message), or with this off on the request's thread once the row commits. On
# PostgreSQL the commit's notice wakes the workers, so the message is only the delivery that
# never gets lost, and the thread saves the request its cost; with SQLite the message is what
# wakes a worker, so it goes at once (api/services/dispatcher.py).
JOB_DISPATCH_THREAD = env_bool("JOB_DISPATCH_THREAD", DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql")
# Threads per web process that run requests' sync code (inference_service/asgi_handler.py).
WEB_REQUEST_THREADS = env_int("WEB_REQUEST_THREADS", 8, minimum=1)
# Warm each web process up before it serves (inference_service/warmup.py). serve_web turns it on
# for its daphne processes; an ASGI app imported elsewhere (tests, a shell) leaves it off.
WEB_WARM_UP = env_bool("WEB_WARM_UP", False)

# One handler, which redacts secrets (API keys sent as ``?api_key=``, say) from every line it
# writes. Django's own loggers write through it too instead of Django's default handlers, which
# would print the same records unredacted (inference_service/redaction.py; daphne's access log is
# redacted by inference_service/daphne_server.py).
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "filters": {"redact_secrets": {"()": "inference_service.redaction.RedactSecretsFilter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["redact_secrets"]}},
    "loggers": {
        "django": {"handlers": ["console"], "level": "INFO", "propagate": False},
        "django.server": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
}
