"""inference_service.warmup: a web process pays its one-time costs before its first request."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import threading

import pytest
from django.conf import settings
from django.db import connection

from inference_service import warmup

pytestmark = pytest.mark.django_db(transaction=True)

ENGINE_BINDING = "_kombu.binding.engine"  # kombu's Redis transport: the engine queue's declaration


def test_the_request_path_warm_up_declares_the_engine_queue_and_fails_no_step(redis_client):
    # In a new interpreter, as in a web process that starts: in this one, an earlier test's publish
    # leaves kombu remembering the queue as declared, so a warm-up here would declare nothing.
    db = connection.settings_dict
    url = (f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}" if connection.vendor == "postgresql"
           else f"sqlite:///{db['NAME']}")
    code = ("import django, json; django.setup(); from inference_service import warmup; "
            "print(json.dumps(warmup.warm_up_http()))")
    assert not redis_client.exists(ENGINE_BINDING)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                          env={**os.environ, "DATABASE_URL": url, "REDIS_URL": settings.REDIS_URL})
    assert json.loads(done.stdout.splitlines()[-1]) == []  # no step failed
    # What the first publish of a job did (Celery's app, the broker connection, the declaration).
    assert redis_client.exists(ENGINE_BINDING)


def test_a_dependency_that_is_down_costs_only_its_own_steps(redis_client, monkeypatch, caplog):
    import api.authentication  # noqa: F401 - imported now, it binds the real lookup, not the patch below
    import api.redis_client
    import api.selectors.api_keys

    def down(**_):
        raise ConnectionError("down")

    ran = []

    def _celery():
        ran.append("_celery")

    monkeypatch.setattr(warmup, "_celery", _celery)
    monkeypatch.setattr(api.selectors.api_keys, "api_key_with_owner", down)
    with caplog.at_level(logging.WARNING, logger="inference_service.warmup"):
        assert warmup.warm_up_http() == ["_database"]
    assert "web warm-up: _database failed" in caplog.text
    assert ran == ["_celery"]  # the steps after it still ran

    # Redis down: the broker is the same Redis, so Celery's step (and its retries) is skipped.
    monkeypatch.setattr(api.redis_client, "get_redis", down)
    assert warmup.warm_up_http() == ["_database", "_redis", "_celery"]
    assert ran == ["_celery"]


def test_the_submission_warm_up_sends_an_unauthenticated_post_through_every_request_thread(redis_client, caplog):
    from django.core.signals import request_finished, request_started

    from api.models import Job
    from inference_service.asgi_handler import OneHopASGIHandler

    handler = OneHopASGIHandler(threads=3)
    started, finished = [], []

    def on_started(scope, **_):
        started.append((threading.get_ident(), scope["method"], scope["path"]))

    def on_finished(**_):
        finished.append(threading.get_ident())

    request_started.connect(on_started)
    request_finished.connect(on_finished)
    try:
        with caplog.at_level(logging.INFO):
            assert warmup.warm_up_http(handler) == []
    finally:
        request_started.disconnect(on_started)
        request_finished.disconnect(on_finished)
    # Each pass ran one POST /api/v1/jobs on each of the three request threads, to its end.
    assert len(started) == 3 * warmup.WARM_UP_PASSES
    assert {path for _, _, path in started} == {"/api/v1/jobs"} and {m for _, m, _ in started} == {"POST"}
    assert len({thread for thread, _, _ in started}) == 3
    assert len(finished) == len(started)
    assert not Job.objects.exists()  # answered 401: nothing was submitted
    # The warm-up's own 401s are not logged as a client's.
    assert not [r for r in caplog.records if r.name == "django.request"], caplog.text


def test_the_submission_warm_up_of_a_model_without_a_chat_template_leaves_chat_out(redis_client, settings,
                                                                                   tiny_model_path, tmp_path):
    from api.tokenization import get_tokenizer
    from inference_service.asgi_handler import OneHopASGIHandler
    from tests.api.test_jobs_chat_template import _model_copy

    settings.MODEL_PATH = str(_model_copy(tiny_model_path, tmp_path, chat_template=None))
    assert not get_tokenizer().has_chat_template
    assert warmup.warm_up_http(OneHopASGIHandler(threads=1)) == []  # messages would be a 400 there


def test_the_submission_warm_up_is_skipped_when_the_database_is_down(redis_client, monkeypatch):
    import api.authentication  # noqa: F401 - imported now, it binds the real lookup, not the patch below
    import api.selectors.api_keys
    from inference_service.asgi_handler import OneHopASGIHandler

    def down(**_):
        raise ConnectionError("down")

    monkeypatch.setattr(warmup, "_celery", lambda: None)
    monkeypatch.setattr(api.selectors.api_keys, "api_key_with_owner", down)
    sent = []
    handler = OneHopASGIHandler(threads=2)
    monkeypatch.setattr(handler, "respond_on_each_thread", lambda *a: sent.append(a) or [])
    monkeypatch.setattr(handler, "run_on_each_thread", lambda *a: sent.append(a) or [])
    assert warmup.warm_up_http(handler) == ["_database", "_submission", "_rehearsal"]
    assert sent == []  # every request thread would have waited for the database


def test_the_submission_warm_up_fails_loudly_on_an_answer_other_than_401(redis_client, monkeypatch, caplog):
    from django.http import HttpResponse

    from inference_service.asgi_handler import OneHopASGIHandler

    monkeypatch.setattr(warmup, "_celery", lambda: None)
    handler = OneHopASGIHandler(threads=2)
    monkeypatch.setattr(handler, "respond_on_each_thread", lambda *a: [HttpResponse(status=400)] * 2)
    with caplog.at_level(logging.WARNING, logger="inference_service.warmup"):
        assert warmup.warm_up_http(handler) == ["_submission"]
    assert "web warm-up: _submission failed" in caplog.text and "answered [400], not 401" in caplog.text


def test_the_websocket_path_warm_up_runs_on_the_event_loop(redis_client):
    assert asyncio.run(warmup.warm_up_websocket()) == []


def test_outside_daphne_no_websocket_warm_up_is_scheduled(monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "twisted.internet.reactor", raising=False)
    assert warmup.schedule_websocket_warm_up() is False


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the rehearsed submission call is PostgreSQL's")
def test_every_request_thread_rehearses_the_submission_on_a_connection_it_keeps(redis_client, monkeypatch):
    from django.db import connections

    import api.services.job_insert as job_insert
    from api.models import ApiKey, Job
    from inference_service.asgi_handler import OneHopASGIHandler
    from tests.api.test_job_insert_rehearsal import _warm_state

    monkeypatch.setattr(warmup, "_celery", lambda: None)
    # A request thread keeps its connection (CONN_MAX_AGE, as with a pool a backend is reused).
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 60)
    rehearse, rehearsed = job_insert.job_insert_rehearsal, []

    def spy(**kw):
        done = rehearse(**kw)
        rehearsed.append((threading.get_ident(), connection.connection.info.backend_pid, _warm_state()))
        return done

    monkeypatch.setattr(job_insert, "job_insert_rehearsal", spy)
    handler = OneHopASGIHandler(threads=3)
    try:
        assert warmup.warm_up_http(handler) == []
        # Each thread's backend after the warm-up: still the one that rehearsed.
        kept = handler.run_on_each_thread(lambda: (threading.get_ident(), connection.connection.info.backend_pid))
    finally:
        handler.run_on_each_thread(connections.close_all)
    assert len({thread for thread, _, _ in rehearsed}) == 3 == len(rehearsed)
    assert all({"api_key_gate", "api_job_queued_notify"} <= warm for _, _, warm in rehearsed)
    assert {(thread, pid) for thread, pid, _ in rehearsed} == set(kept)
    assert not Job.objects.exists() and not ApiKey.objects.exists()  # nothing was written


def test_no_rehearsal_where_each_request_closes_its_connection(redis_client, monkeypatch):
    import api.services.job_insert as job_insert
    from inference_service.asgi_handler import OneHopASGIHandler

    monkeypatch.setattr(warmup, "_celery", lambda: None)
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 0)  # and no pool: a new backend each time
    monkeypatch.delitem(connection.settings_dict.get("OPTIONS", {}), "pool", raising=False)
    calls = []
    monkeypatch.setattr(job_insert, "job_insert_rehearsal", lambda **kw: calls.append(kw))
    assert warmup.warm_up_http(OneHopASGIHandler(threads=2)) == []
    assert calls == []
