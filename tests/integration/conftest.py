"""Fixtures of the integration tests: real Postgres (the pytest-django test DB, committed with
``transactional_db`` so subprocesses see it), real Redis (the test DB of REDIS_URL, flushed),
engine workers and daphne as subprocesses.

Short leases and intervals (environment of the subprocesses) keep the durability tests fast."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.conf import settings
from django.db import connection

from api.common.redis_client import get_redis
from api.common.redis_keys import worker_heartbeat_key
from inference_service.celery import app
from tests.integration.procs import START_TIMEOUT_S, Proc, start_worker, wait_for

FAST_ENV = {
    "JOB_LEASE_S": "2",
    "WORKER_HEARTBEAT_S": "0.5",
    "JOB_REDISPATCH_AFTER_S": "2",
    "WORKER_DRAIN_S": "5",
}


# Integration tests use their own Redis DB on REDIS_URL's server: unit tests flush the REDIS_URL
# DB freely, and a flush in the middle of a durability test (another test run on the same
# machine) would look like data loss.
INTEGRATION_REDIS_DB = int(os.environ.get("INTEGRATION_REDIS_DB", "14"))


@pytest.fixture
def redis_db(monkeypatch):
    """The integration Redis DB, flushed before and after; this process's settings, Redis client
    and Celery producer point at it for the test. Refuses DB 0 (a developer's data)."""
    if INTEGRATION_REDIS_DB == 0:
        pytest.fail("INTEGRATION_REDIS_DB=0 looks like a real database")
    url = urlunsplit(urlsplit(settings.REDIS_URL)._replace(path=f"/{INTEGRATION_REDIS_DB}"))
    monkeypatch.setattr(settings, "REDIS_URL", url)
    _point_celery_at(url)
    get_redis.cache_clear()
    client = get_redis()
    client.flushdb()
    yield client
    client.flushdb()
    get_redis.cache_clear()
    _point_celery_at(settings.CELERY_BROKER_URL)


def _point_celery_at(url: str) -> None:
    # Celery caches its connection and producer pools per app; drop them so the next publish
    # connects to ``url``.
    app.conf.broker_url = url
    app._pool = None
    app.amqp._producer_pool = None


@pytest.fixture
def fast_timings(monkeypatch):
    for name, value in FAST_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(settings, "JOB_LEASE_S", float(FAST_ENV["JOB_LEASE_S"]))
    monkeypatch.setattr(settings, "JOB_REDISPATCH_AFTER_S", float(FAST_ENV["JOB_REDISPATCH_AFTER_S"]))


@pytest.fixture
def service_env(transactional_db, redis_db, fast_timings, tiny_model_path) -> dict[str, str]:
    """Environment for subprocesses: this test's database and Redis, the tiny model."""
    db = connection.settings_dict
    url = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    env = dict(os.environ)
    env.update(FAST_ENV)
    env.update({
        "DATABASE_URL": url,
        "REDIS_URL": settings.REDIS_URL,
        "MODEL_PATH": str(tiny_model_path),
        "DJANGO_SETTINGS_MODULE": "inference_service.settings",
        "PYTHONUNBUFFERED": "1",
    })
    # The workers share the cores with the test, daphne, Redis and Postgres (see scripts/run.sh).
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    settings.MODEL_PATH = str(tiny_model_path)
    return env


@pytest.fixture
def workers(service_env, tmp_path) -> Iterator[WorkerFactory]:
    factory = WorkerFactory(service_env, tmp_path)
    yield factory
    factory.stop_all()


class WorkerFactory:
    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.log_dir = log_dir
        self.procs: list[Proc] = []

    def start(self, worker_id: str, **env: str) -> Proc:
        """Start a worker and wait until its heartbeat is in Redis (the model is loaded)."""
        proc = start_worker({**self.env, **env}, worker_id, self.log_dir)
        self.procs.append(proc)
        redis = get_redis()

        def ready() -> bool:
            assert proc.alive(), f"worker {worker_id} exited:\n{proc.log_tail()}"
            return bool(redis.exists(worker_heartbeat_key(worker_id))) and b"ready" in proc.log_path.read_bytes()

        wait_for(ready, START_TIMEOUT_S, f"worker {worker_id} to start")
        return proc

    def stop_all(self) -> None:
        for proc in self.procs:
            proc.stop()
