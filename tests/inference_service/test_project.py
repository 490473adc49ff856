"""The Django project's wiring: env-driven settings, ASGI routing, the Celery app."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from inference_service import env

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("reader", "raw", "expected"),
    [(env.env_int, "12", 12), (env.env_bool, "yes", True), (env.env_bool, "0", False), (env.env_float, "1.5", 1.5),
     (env.env_list, "a, b,,c", ["a", "b", "c"]), (env.env_str, "x", "x")],
)
def test_env_readers_parse_values(monkeypatch, reader, raw, expected):
    monkeypatch.setenv("SOME_SETTING", raw)
    assert reader("SOME_SETTING", type(expected)() if not isinstance(expected, list) else []) == expected


def test_env_readers_fall_back_to_the_default_when_unset_or_empty(monkeypatch):
    monkeypatch.setenv("EMPTY_SETTING", "")
    assert env.env_int("EMPTY_SETTING", 7) == 7 and env.env_int("UNSET_SETTING_XYZ", 8) == 8


@pytest.mark.parametrize(("reader", "raw"), [(env.env_int, "ten"), (env.env_bool, "maybe"), (env.env_float, "x")])
def test_env_readers_fail_loudly_on_bad_values_naming_the_variable(monkeypatch, reader, raw):
    monkeypatch.setenv("BAD_SETTING", raw)
    with pytest.raises(ImproperlyConfigured, match="BAD_SETTING"):
        reader("BAD_SETTING", 0)


def test_env_int_enforces_its_minimum(monkeypatch):
    monkeypatch.setenv("BAD_SETTING", "0")
    with pytest.raises(ImproperlyConfigured):
        env.env_int("BAD_SETTING", 5, minimum=1)


def _settings_in_subprocess(extra_env: dict[str, str], expression: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "MODEL_PATH")}
    environment.update(extra_env, DJANGO_SETTINGS_MODULE="inference_service.settings")
    code = f"import django; django.setup(); from django.conf import settings as s; print({expression})"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environment, capture_output=True, text=True)


def test_embedded_defaults_are_sqlite_under_var_and_local_redis():
    result = _settings_in_subprocess({}, "s.DATABASES['default']['ENGINE'], s.DATABASES['default']['NAME'], s.REDIS_URL")
    assert result.returncode == 0, result.stderr
    assert "sqlite3" in result.stdout and "var/db.sqlite3" in result.stdout
    assert "redis://127.0.0.1:6379/0" in result.stdout


def test_embedded_sqlite_uses_wal_and_waits_for_the_write_lock(tmp_path):
    # Several processes write the embedded database; a locked database must mean "wait".
    db = tmp_path / "db.sqlite3"
    expression = (
        "__import__('django.db').db.connection.cursor().execute('PRAGMA journal_mode').fetchone()[0], "
        "s.DATABASES['default']['OPTIONS']['timeout'], s.DATABASES['default']['OPTIONS']['transaction_mode']"
    )
    result = _settings_in_subprocess({"DATABASE_URL": f"sqlite:///{db}"}, expression)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-3:] == ["wal", "20", "IMMEDIATE"]


def test_database_url_and_redis_url_switch_backends():
    result = _settings_in_subprocess(
        {"DATABASE_URL": "postgres://u@db:5432/prod", "REDIS_URL": "redis://cache:6379/2"},
        "s.DATABASES['default']['ENGINE'], s.CHANNEL_LAYERS['default']['CONFIG']['hosts'], s.CELERY_BROKER_URL",
    )
    assert "postgresql" in result.stdout and "redis://cache:6379/2" in result.stdout


def test_db_pool_is_opt_in_and_only_for_postgresql():
    pooled = "s.DATABASES['default']['OPTIONS'].get('pool'), s.DATABASES['default']['CONN_MAX_AGE']"
    result = _settings_in_subprocess(
        {"DATABASE_URL": "postgres://u@db:5432/prod", "DB_POOL": "1", "DB_CONN_MAX_AGE": "60",
         "DB_POOL_MAX_SIZE": "7"}, pooled
    )
    assert result.returncode == 0, result.stderr
    # A pool excludes persistent connections (Django refuses both): CONN_MAX_AGE is forced to 0.
    assert "'max_size': 7" in result.stdout and result.stdout.strip().endswith(" 0")
    off = _settings_in_subprocess({"DATABASE_URL": "postgres://u@db:5432/prod"}, pooled)
    assert off.returncode == 0 and off.stdout.startswith("None ")
    sqlite = _settings_in_subprocess({"DB_POOL": "1"}, "s.DATABASES['default'].get('OPTIONS', {}).get('pool')")
    assert sqlite.returncode == 0 and sqlite.stdout.strip() == "None"


def test_db_pool_serves_queries_against_postgresql():
    pytest.importorskip("psycopg_pool")
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        pytest.skip("needs DATABASE_URL on PostgreSQL")
    environment = {**os.environ, "DATABASE_URL": url.rsplit("/", 1)[0] + "/postgres", "DB_POOL": "1",
                   "DJANGO_SETTINGS_MODULE": "inference_service.settings"}
    code = (
        "import django; django.setup(); from django.db import connection as c\n"
        "for _ in range(6):\n"
        "    c.cursor().execute('SELECT 1'); c.close()\n"
        "stats = c.pool.get_stats()\n"
        "print(stats['requests_num'] == 6, stats['connections_num'] < 6)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environment, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True True"


def test_a_bad_setting_stops_start_up():
    result = _settings_in_subprocess({"MAX_TOKENS_CAP": "lots"}, "1")
    assert result.returncode != 0 and "MAX_TOKENS_CAP" in result.stderr


def test_asgi_routes_http_to_djangos_own_handler_and_websockets_to_the_api_routes():
    from channels.routing import ProtocolTypeRouter
    from django.core.handlers.asgi import ASGIHandler

    from inference_service import asgi

    assert isinstance(asgi.application, ProtocolTypeRouter)
    assert set(asgi.application.application_mapping) == {"http", "websocket"}
    assert type(asgi.django_http) is ASGIHandler


def test_celery_routes_jobs_to_the_engine_queue_and_schedules_reconciliation():
    from inference_service.celery import app

    assert app.main == "inference_service"
    assert app.conf.task_routes["api.tasks.run_job"] == {"queue": "engine"}
    schedule = {entry["task"]: entry["schedule"] for entry in app.conf.beat_schedule.values()}
    assert schedule == {
        "api.tasks.reconcile_jobs": 10.0,
        "api.tasks.expire_jobs": 60.0,
        "api.tasks.rollup_usage": 300.0,
        "api.tasks.purge_jobs": 3600.0,
        "api.tasks.send_due_webhooks": 2.0,
        "api.tasks.tick_batches": 5.0,
    }
    # Webhook attempts go to the webhooks worker's queue, never to an engine worker or the light
    # worker (where one key's hanging receivers held every batch and every other key's webhooks).
    assert app.conf.task_routes["api.tasks.deliver_webhook"] == {"queue": "webhooks"}
    assert app.conf.task_default_queue == "celery"


def test_a_worker_registers_every_task_under_the_name_its_messages_carry():
    from inference_service.celery import app

    app.loader.import_default_modules()  # what a worker does when it starts: the domains' tasks.py
    assert {name for name in app.tasks if name.startswith("api.")} == {
        "api.tasks.run_job", "api.tasks.reconcile_jobs", "api.tasks.expire_jobs", "api.tasks.purge_jobs",
        "api.tasks.drop_job_stream", "api.tasks.rollup_usage", "api.tasks.deliver_webhook",
        "api.tasks.send_due_webhooks", "api.tasks.start_batch", "api.tasks.batch_progress",
        "api.tasks.tick_batches",
    }


@pytest.mark.django_db
def test_models_and_migrations_are_in_sync():
    from io import StringIO

    from django.core.management import call_command

    call_command("makemigrations", "--check", "--dry-run", stdout=StringIO())


def test_only_runserver_loads_daphnes_app_and_its_twisted_reactor():
    """daphne's app serves `manage.py runserver` over ASGI; every other Django process (workers,
    Celery, management commands) sets up without importing daphne or Twisted."""
    probe = ("import sys, django; django.setup(); from django.apps import apps; "
             "print(apps.is_installed('daphne'), 'twisted.internet.reactor' in sys.modules)")
    environment = {**os.environ, "DJANGO_SETTINGS_MODULE": "inference_service.settings"}
    worker = subprocess.run([sys.executable, "-c", probe, "run_engine_worker"], cwd=ROOT, env=environment,
                            capture_output=True, text=True)
    runserver = subprocess.run([sys.executable, "-c", probe, "runserver"], cwd=ROOT, env=environment,
                               capture_output=True, text=True)
    assert worker.returncode == 0 and runserver.returncode == 0, worker.stderr + runserver.stderr
    assert worker.stdout.split() == ["False", "False"]
    assert runserver.stdout.split() == ["True", "True"]
