"""Fixtures for the web side: API clients authenticated with real keys, a clean Redis DB, and
the Celery dispatch replaced by a recorder (unit tests never talk to a broker)."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from api.redis_client import get_redis
from tests.api.factories import make_api_key, make_user


@pytest.fixture(autouse=True)
def _model_path(settings, tiny_model_path):
    settings.MODEL_PATH = str(tiny_model_path)


@pytest.fixture(autouse=True)
def _dispatch_on_the_callers_thread(settings):
    """Publish on the test's thread (the default, set here in case the environment turns the
    thread on): the dispatcher thread's own DB connection could not see the test's uncommitted
    transaction. tests/api/test_dispatcher.py covers the thread."""
    settings.JOB_DISPATCH_THREAD = False


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


@pytest.fixture
def redis_client():
    """The real Redis, flushed before and after the test. Refuses DB 0 (a developer's data)."""
    if settings.REDIS_URL.rstrip("/").endswith("/0") or settings.REDIS_URL.count("/") < 3:
        pytest.fail(f"REDIS_URL={settings.REDIS_URL} looks like a real database; run tests via `make test`")
    client = get_redis()
    client.flushdb()
    yield client
    client.flushdb()


@contextmanager
def fake_tasks_module(run_job) -> Iterator[None]:
    """Serve ``api.tasks`` from a stand-in. Only that one sys.modules entry is swapped and
    restored (patch.dict on sys.modules would also drop every module imported meanwhile, leaving
    the URLconf pointing at module objects that later patches no longer reach)."""
    saved = sys.modules.get("api.tasks")
    sys.modules["api.tasks"] = mock.Mock(run_job=run_job)
    try:
        yield
    finally:
        if saved is None:
            sys.modules.pop("api.tasks", None)
        else:
            sys.modules["api.tasks"] = saved


@pytest.fixture
def dispatched():
    """Records job ids handed to ``api.tasks.run_job.delay`` (unit tests never reach a broker)."""
    calls: list[str] = []
    fake_task = mock.Mock()
    fake_task.delay.side_effect = calls.append
    with fake_tasks_module(fake_task):
        yield calls


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
