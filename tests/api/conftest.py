"""Fixtures for the web side: API clients authenticated with real keys, a clean Redis DB, and
the Celery app's sends replaced by a recorder (unit tests never talk to a broker)."""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from api.common.redis_client import get_redis
from api.jobs.services.dispatch import RUN_JOB_TASK
from inference_service.celery import app as celery_app
from tests.api.factories import make_api_key, make_user
from tests.api.mistral_model import NEMO, V03, V11, build_mistral_model, chat_template


@pytest.fixture(scope="session")
def _migrated_sqlite(tmp_path_factory: pytest.TempPathFactory, tiny_model_path: Path) -> Path:
    """A SQLite file (the embedded default database) that ``manage.py migrate`` brought to the
    latest migration: once per run, for the tests that run the service's SQL on SQLite."""
    path = tmp_path_factory.mktemp("sqlite") / "db.sqlite3"
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{path}", "MODEL_PATH": str(tiny_model_path),
           "DJANGO_SETTINGS_MODULE": "inference_service.settings"}
    env.pop("TEST_DATABASE_NAME", None)
    out = subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=Path(__file__).parents[2],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return path


@pytest.fixture
def migrated_sqlite_url(tmp_path: Path, _migrated_sqlite: Path) -> str:
    """``DATABASE_URL`` of this test's own copy of the migrated SQLite file."""
    copy = tmp_path / "db.sqlite3"
    shutil.copyfile(_migrated_sqlite, copy)
    return f"sqlite:///{copy}"


@pytest.fixture(autouse=True)
def _model_path(settings, tiny_model_path):
    settings.MODEL_PATH = str(tiny_model_path)


@pytest.fixture
def consumer_connections_closed():
    """Close, after the test, the database connections its consumers opened on other threads.

    channels.testing's communicators replace ``channels.db.close_old_connections`` with a no-op
    while they run the application, so a consumer's ``database_sync_to_async`` call leaves its
    executor thread's connection open; the thread is gone once the test's event loop closes, and
    the connection lingers until garbage collection. Left over at the end of the run, such
    sessions made dropping the test database fail ("being accessed by other users")."""
    yield
    gc.collect()


@pytest.fixture(autouse=True)
def _fresh_live_workers():
    """Each test reads the workers' heartbeats afresh (they are cached for a second per process)."""
    from api.serving.workers import worker_ids_forget

    worker_ids_forget()
    yield
    worker_ids_forget()


@pytest.fixture
def redis_client():
    """The real Redis, flushed before and after the test. Refuses DB 0 (a developer's data)."""
    if settings.REDIS_URL.rstrip("/").endswith("/0") or settings.REDIS_URL.count("/") < 3:
        pytest.fail(f"REDIS_URL={settings.REDIS_URL} looks like a real database; run tests via `make test`")
    client = get_redis()
    client.flushdb()
    yield client
    client.flushdb()


class Broker:
    """Stands in for the broker behind the Celery app's ``send_task``: records every message, or
    with ``down`` set raises it as a real broker outage would."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, list[Any], dict[str, Any]]] = []  # (task name, args, options)
        self.job_ids: list[str] = []  # the jobs sent to the engine queue (run_job), in order
        self.down: Exception | None = None

    def send_task(self, name: str, args: Any = (), **options: Any) -> None:
        if self.down is not None:
            raise self.down
        self.messages.append((name, list(args), options))
        if name == RUN_JOB_TASK:
            self.job_ids.append(args[0])


@pytest.fixture
def broker():
    stand_in = Broker()
    with mock.patch.object(celery_app, "send_task", side_effect=stand_in.send_task):
        yield stand_in


@pytest.fixture
def dispatched(broker) -> list[str]:
    """Ids of the jobs sent to the engine queue, in order (unit tests never reach a broker)."""
    return broker.job_ids


@pytest.fixture
def user(db):
    return make_user()


@pytest.fixture
def key_and_secret(user):
    return make_api_key(owner=user)


@pytest.fixture
def api_key(key_and_secret):
    return key_and_secret[0]


@pytest.fixture
def api_client(key_and_secret, redis_client, dispatched) -> APIClient:
    """An API client sending the user's key as a Bearer token."""
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {key_and_secret[1]}")
    return api


@pytest.fixture
def anon_client() -> APIClient:
    return APIClient()


@pytest.fixture(scope="session", params=[V03, NEMO, V11])
def mistral_model_path(request, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model folder named ``tiny`` with Mistral's tokenizer layout and one of Mistral's own chat
    templates (tests/api/mistral_model.py), once per template."""
    return build_mistral_model(tmp_path_factory.mktemp(request.param) / "tiny", chat_template(request.param))
