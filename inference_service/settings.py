"""Django settings, read from the environment through :mod:`inference_service.env`.

Embedded defaults (no variables set): SQLite under ``var/``, Redis on localhost DB 0, the demo
model shipped in ``demo_model/demo``. ``DATABASE_URL``/``REDIS_URL``/``MODEL_PATH``
switch to real deployments.
"""

from __future__ import annotations

import sys
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from inference_service.deployment import refuse_unsafe_settings
from inference_service.env import (
    env_bool,
    env_float,
    env_given,
    env_int,
    env_json_object,
    env_list,
    env_model_list,
    env_networks,
    env_str,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"

DEBUG = env_bool("DEBUG", False)
# The embedded default is for a developer machine; production sets SECRET_KEY.
SECRET_KEY = env_str("SECRET_KEY", "insecure-dev-key-set-SECRET_KEY-in-production")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
# Outside DEBUG, a placeholder SECRET_KEY or ALLOWED_HOSTS=* stops every process here.
refuse_unsafe_settings(debug=DEBUG, secret_key=env_given("SECRET_KEY"), allowed_hosts=ALLOWED_HOSTS)
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    # daphne's app only makes `manage.py runserver` serve ASGI. Loading it imports daphne's server
    # and Twisted's reactor, which no other Django process uses (the engine worker, Celery, the
    # migrations); the service's web (inference_service.serve_web) imports daphne itself.
    *(["daphne"] if sys.argv[1:2] == ["runserver"] else []),
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
    # instead of failing with "database is locked". The backend queues the service's writers on a
    # lock of its own first (inference_service/sqlite_backend/base.py says why).
    DATABASES["default"]["ENGINE"] = "inference_service.sqlite_backend"
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        timeout=20,
        transaction_mode="IMMEDIATE",
        init_command="PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    )
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" and env_bool("DB_POOL", False):
    # For the web process (daphne): Django runs each sync view on a thread of its own, so
    # CONN_MAX_AGE cannot keep connections; without a pool every request opens one, and a
    # PostgreSQL backend's start costs the server more CPU than the rest of a submission. With
    # psycopg's pool (needs psycopg[pool]) a request borrows an open connection and returns it.
    # Long-running processes (the engine worker) keep persistent connections instead: leave
    # DB_POOL off for them (Django refuses a pool together with CONN_MAX_AGE != 0).
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    # Django's health checks would make the pool check each connection it lends, and psycopg's
    # pool waits 1, 2, 4 s... between failed checks: after pg_terminate_backend on its idle
    # connections, a request would wait many seconds for its 503. Instead a request
    # that meets a dead connection is a 503 at once (api/common/errors.py), which also has the pool's
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

# Job outputs travel through each job's Redis stream, read directly by the consumers that follow
# it (api/streaming/relay.py); the channel layer carries only what the consumers send each other.
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL]},
    }
}

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
# A message is acknowledged after its task ran: run_job has claimed its job by then (or found it
# not claimable). A worker that dies before leaves the message to be delivered again.
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
    "DEFAULT_AUTHENTICATION_CLASSES": ["api.keys.authentication.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["api.common.parsers.StrictJSONParser"],
    "EXCEPTION_HANDLER": "api.common.exception_handler.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "MLX inference service",
    "DESCRIPTION": "Text-generation jobs over REST and WebSocket, authenticated with API keys.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "api.system.schema_hooks.add_job_events",
                           "api.system.schema_hooks.add_job_create_rules",
                           "api.openai_api.schema.add_openai_completions"],
}

# The model the web side tokenizes for (the engine worker loads the same folder): by default the
# demo model shipped in the repository, or (a checkout without its weights) the locally built test
# model, as scripts/run.sh chooses.
_DEMO_MODEL = BASE_DIR / "demo_model" / "demo"
MODEL_PATH = env_str("MODEL_PATH", str(_DEMO_MODEL if (_DEMO_MODEL / "model.safetensors").exists()
                                       else VAR_DIR / "models" / "tiny"))
# An engine worker serves the model at MODEL_PATH under MODEL_NAME (default: the folder's name) and
# consumes that model's queues. The web side accepts jobs for MODELS: a comma-separated list of
# ``name=path`` (or a bare path, named after its folder); empty means the one model at MODEL_PATH.
MODEL_NAME = env_str("MODEL_NAME", "")
MODELS = env_model_list("MODELS")
# Prefix-affinity routing of a model's jobs over its live workers (api/jobs/services/queue_routing.py);
# off, every job goes to the model's shared queue.
ROUTING_AFFINITY = env_bool("ROUTING_AFFINITY", True)

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
# How long a job's Redis stream stays replayable after its last write; a client that resumes later
# gets the job's end from the database.
JOB_STREAM_TTL_S = env_int("JOB_STREAM_TTL_S", 6 * 3600, minimum=1)
# The event streams (SSE, OpenAI's) send a comment this often, so proxies keep idle ones open.
SSE_KEEPALIVE_S = env_float("SSE_KEEPALIVE_S", 15.0, minimum=0.01)
# Finished jobs' rows are deleted this many days after they ended (0: kept). At least 2, so the
# quotas and the usage roll-up never lose rows they still read (api/jobs/services/deletion.py).
JOB_RETENTION_DAYS = env_int("JOB_RETENTION_DAYS", 0, minimum=0)
if 0 < JOB_RETENTION_DAYS < 2:
    raise ImproperlyConfigured(f"JOB_RETENTION_DAYS={JOB_RETENTION_DAYS} must be 0 (keep every job) or >= 2")

# The Files and Batch APIs (api/batches/models.py). An upload of more than FILES_MAX_BYTES or
# FILES_MAX_LINES lines is refused. A key has at most BATCH_JOBS_IN_FLIGHT_PER_KEY of its batch
# jobs sent to the engine (queued there or running) at once; the rest wait in the database for the
# feeder (api/batches/feed.py). 40 is one engine's batch (ENGINE_COMPLETION_BATCH_SIZE, 32)
# and 8 waiting, which take a slot as soon as it is free, without the feeder's round trip; batch
# jobs have BATCH_JOB_PRIORITY, less urgent than any key's class (10 by default), so the engine
# admits an interactive job before them (ENGINE_POLICY below). docs/benchmarks.md has the figures.
FILES_MAX_BYTES = env_int("FILES_MAX_BYTES", 200 * 1024 * 1024, minimum=1)
FILES_MAX_LINES = env_int("FILES_MAX_LINES", 50_000, minimum=1)
BATCH_JOBS_IN_FLIGHT_PER_KEY = env_int("BATCH_JOBS_IN_FLIGHT_PER_KEY", 40, minimum=1)
BATCH_JOB_PRIORITY = env_int("BATCH_JOB_PRIORITY", 100, minimum=0)
# Where files' bytes live: any backend of Django's storage API. The default keeps them under
# var/files; e.g. FILES_STORAGE_BACKEND=storages.backends.s3.S3Storage with
# FILES_STORAGE_OPTIONS='{"bucket_name": "..."}' (django-storages) keeps them in S3.
FILES_STORAGE_BACKEND = env_str("FILES_STORAGE_BACKEND", "django.core.files.storage.FileSystemStorage")
FILES_STORAGE_OPTIONS = env_json_object("FILES_STORAGE_OPTIONS", {"location": str(VAR_DIR / "files")}
                                        if FILES_STORAGE_BACKEND.endswith("FileSystemStorage") else {})
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "files": {"BACKEND": FILES_STORAGE_BACKEND, "OPTIONS": FILES_STORAGE_OPTIONS},
}

# The order in which an engine worker's engine admits waiting jobs, passed to the engine process
# it spawns: "priority" (then arrival), so that keys' priority classes and batch jobs' lower
# urgency count; "fcfs" is the engine's own default (arrival alone).
ENGINE_POLICY = env_str("ENGINE_POLICY", "priority")
if ENGINE_POLICY not in ("priority", "fcfs"):
    raise ImproperlyConfigured(f"ENGINE_POLICY={ENGINE_POLICY!r} must be 'priority' or 'fcfs'")
# How many prompts an engine worker's engine prefills in one step, passed to the engine process
# (the engine's own default, the seed's and mlx-lm's, is 8). A step that admits prompts costs
# several decode steps whatever their number, so under load fewer, larger admissions serve more
# tokens per second; short answers pay for it (docs/benchmarks.md, "The job path at load", has
# both). max_num_batched_tokens still bounds the prompt tokens of one step.
ENGINE_PREFILL_BATCH_SIZE = env_int("ENGINE_PREFILL_BATCH_SIZE", 32, minimum=1)

# Engine workers (api/worker/). WORKER_ID names a worker in heartbeats and job rows (default:
# host-pid-random). A held job's lease (JOB_LEASE_S) is renewed every WORKER_HEARTBEAT_S; on
# SIGTERM running jobs get WORKER_DRAIN_S to finish before they go back to the queue. A queued job
# that no worker claimed JOB_REDISPATCH_AFTER_S after its dispatch is sent again (its message was
# lost). Deltas are written at most every WORKER_STREAM_INTERVAL_MS (first tokens and finals at
# once): 40 ms is about two steps of a small model, so streams stay smooth while each write carries
# several tokens. WORKER_PREFETCH job messages are taken from the broker at once.
WORKER_ID = env_str("WORKER_ID", "")
WORKER_HEARTBEAT_S = env_float("WORKER_HEARTBEAT_S", 2.0, minimum=0.1)
WORKER_DRAIN_S = env_float("WORKER_DRAIN_S", 30.0, minimum=0.0)
JOB_REDISPATCH_AFTER_S = env_float("JOB_REDISPATCH_AFTER_S", 30.0, minimum=0.5)
WORKER_STREAM_INTERVAL_MS = env_float("WORKER_STREAM_INTERVAL_MS", 40.0, minimum=0.0)
WORKER_PREFETCH = env_int("WORKER_PREFETCH", 16, minimum=1)

# Webhooks (api/webhooks/services.py). A webhook URL whose host resolves to a private, loopback,
# link-local or other non-global address is refused, at submission and again at each attempt,
# unless WEBHOOK_ALLOW_PRIVATE is on (every address) or the address is in WEBHOOK_ALLOWED_NETWORKS
# (CIDRs, e.g. 10.0.0.0/8 for receivers inside the operator's network). Attempts run on the
# webhooks worker (its own queue and process: batch bookkeeping never waits behind them), at most
# WEBHOOK_CONCURRENCY_PER_KEY of one API key's at once, so one key's hanging receivers cannot take
# every slot. An attempt gets WEBHOOK_CONNECT_TIMEOUT_S to connect and WEBHOOK_TIMEOUT_S in all,
# from its connection to its answer. Failed deliveries are retried with backoff until
# WEBHOOK_RETRY_WINDOW_S after the event.
WEBHOOK_ALLOW_PRIVATE = env_bool("WEBHOOK_ALLOW_PRIVATE", False)
WEBHOOK_ALLOWED_NETWORKS = env_networks("WEBHOOK_ALLOWED_NETWORKS", [])
WEBHOOK_TIMEOUT_S = env_float("WEBHOOK_TIMEOUT_S", 5.0, minimum=0.1)
WEBHOOK_CONNECT_TIMEOUT_S = env_float("WEBHOOK_CONNECT_TIMEOUT_S", 2.0, minimum=0.1)
WEBHOOK_CONCURRENCY_PER_KEY = env_int("WEBHOOK_CONCURRENCY_PER_KEY", 2, minimum=1)
WEBHOOK_RETRY_WINDOW_S = env_int("WEBHOOK_RETRY_WINDOW_S", 24 * 3600, minimum=0)
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
