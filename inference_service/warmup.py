"""Warm a web process up before it serves its first request (``WEB_WARM_UP``, on under serve_web).

A fresh daphne process answered its first ``POST /api/v1/jobs`` in 207-217 ms on the dev VM,
where later ones took 18-23 ms: importing the URLconf's views (~60 ms), Celery finalizing its app
and loading its result backend (~35 ms), the broker connection and the engine queue's declaration
(~20 ms), the database connection and the key lookup's first run. With several web processes
that was every process's first requests after a start or a restart: one job at a time on the GPU
host, the POST's median was 111 ms over 8 jobs, most of which landed on a process that had not
served one yet. Warmed, a process's first POST took 38-45 ms on the VM. The WebSocket path (the event loop's
Redis clients, the executor thread of the consumers' database calls) is warmed on the server's
loop once it runs.

Every step is best effort: a dependency that is down at start-up is logged, and the process
serves anyway (``/api/v1/health`` reports what is down).

Given the request handler, the warm-up then sends the submission's own path through it: one
unauthenticated ``POST /api/v1/jobs`` per request thread (the middleware chain, URL resolution,
DRF's dispatch, the key lookup, the 401's error envelope) and the body's validation and
tokenization, prompt and chat, which a 401 never reaches. Without it, one job at a time on the
GPU host, a process's first real POST still took 20-23 ms from connection to answer, against 8-10
ms for its later ones, and 5.2 ms of CPU in middleware and authentication against 1.2 ms: lazy
imports (the message and session storages), the URL patterns' regular expressions, and each
request thread's first database connection.

Last, on PostgreSQL, every request thread rehearses the submission's database call on the
connection it is handed, and rolls it back: a database backend's first submission cost 6.1-6.5 ms
on the dev VM against 1.1-1.3 ms later (services/job_insert.py), and the pool hands the
connections out in turn, so without it most of a process's first jobs met a backend that had
not run one. A connection the pool opens later (it grew past the request threads' share, or
replaced one that was idle too long or past its lifetime) pays that once, on its first job.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inference_service.asgi_handler import OneHopASGIHandler

logger = logging.getLogger(__name__)


def warm_up_http(handler: OneHopASGIHandler | None = None) -> list[str]:
    """The request path's one-time costs, on this thread (and with ``handler``, on its request
    threads); returns the steps not done (failed, or skipped because one they need failed)."""
    started = time.perf_counter()
    failed = [step.__name__ for step in (_routes, _database, _redis) if not _best_effort(step)]
    # The broker is REDIS_URL's Redis: with it down, kombu's connection retries would only hold
    # the process's start up (6 s on the dev VM).
    if "_redis" in failed or not _best_effort(_celery):
        failed.append("_celery")
    if handler is not None:
        # The key lookup needs the database; without it every request thread would wait for it.
        if "_database" in failed or not _best_effort(lambda: _submission(handler), "_submission"):
            failed.append("_submission")
        if "_database" in failed or not _best_effort(lambda: handler.run_on_each_thread(_rehearsal), "_rehearsal"):
            failed.append("_rehearsal")
    logger.info("web warm-up: request path in %.0f ms", 1000 * (time.perf_counter() - started))
    return failed


def schedule_websocket_warm_up() -> bool:
    """Under daphne (Twisted's asyncio reactor), warm the WebSocket path on the server's event
    loop once it runs: its Redis clients are per loop. False elsewhere (nothing scheduled)."""
    reactor = sys.modules.get("twisted.internet.reactor")
    if reactor is None or type(reactor).__name__ != "AsyncioSelectorReactor":
        return False
    reactor.callWhenRunning(lambda: asyncio.ensure_future(warm_up_websocket()))
    return True


async def warm_up_websocket() -> list[str]:
    """The consumers' one-time costs on the running loop; returns the steps that failed."""
    from channels.db import database_sync_to_async
    from channels.layers import get_channel_layer

    from api.redis_client import get_async_redis

    started = time.perf_counter()
    failed = []
    layer = get_channel_layer()
    steps: list[tuple[str, Callable[[], object]]] = [
        ("async_redis", lambda: get_async_redis().ping()),
        # channels_redis keeps a connection pool per loop (its public ``connection``).
        ("channel_layer", lambda: layer.connection(0).ping() if hasattr(layer, "connection") else asyncio.sleep(0)),
        # The consumers' DB calls run on the loop's default executor (thread_sensitive=False).
        ("consumer_database", lambda: database_sync_to_async(_database, thread_sensitive=False)()),
    ]
    for name, step in steps:
        try:
            await step()
        except Exception:  # noqa: BLE001 - best effort: the first client pays instead
            logger.warning("web warm-up: %s failed; the first WebSocket pays for it", name, exc_info=True)
            failed.append(name)
    logger.info("web warm-up: WebSocket path in %.0f ms", 1000 * (time.perf_counter() - started))
    return failed


def _best_effort(step: Callable[[], None], name: str | None = None) -> bool:
    try:
        step()
    except Exception:  # noqa: BLE001 - best effort: the first request pays instead
        logger.warning("web warm-up: %s failed; the first request pays for it", name or step.__name__, exc_info=True)
        return False
    return True


def _routes() -> None:
    """Import the URLconf (every view module: DRF, the schema views) and DRF's classes, which
    Django and DRF load on the first request (62 ms of imports on the dev VM)."""
    from django.urls import get_resolver
    from rest_framework.settings import api_settings

    get_resolver().url_patterns  # noqa: B018 - imported on first access
    for name in ("DEFAULT_AUTHENTICATION_CLASSES", "DEFAULT_PERMISSION_CLASSES", "DEFAULT_PARSER_CLASSES",
                 "DEFAULT_RENDERER_CLASSES", "DEFAULT_CONTENT_NEGOTIATION_CLASS", "DEFAULT_THROTTLE_CLASSES",
                 "EXCEPTION_HANDLER"):
        getattr(api_settings, name)


def _database() -> None:
    """Open the connection (or the pool's) and run the API key lookup once (an impossible hash)."""
    from django.db import close_old_connections

    from api.selectors.api_keys import api_key_with_owner

    try:
        api_key_with_owner(hashed_key="")
    finally:
        close_old_connections()


def _redis() -> None:
    from api.redis_client import get_redis

    get_redis().ping()


def _celery() -> None:
    """What the first publish of a job did: finalize the app, load the result backend, connect
    to the broker and declare the engine queue (a declaration workers make too)."""
    from api.services.dispatcher import dispatcher
    from api.tasks import ENGINE_QUEUE, run_job
    from inference_service.celery import app

    app.finalize(auto=True)
    run_job.backend  # noqa: B018 - loaded on first use; one per thread after this, cheaply
    app.events  # noqa: B018 - imported by the first publish (its task-sent events)
    with app.producer_or_acquire() as producer:
        producer.maybe_declare(app.amqp.queues[ENGINE_QUEUE])
    dispatcher.start()


WARM_UP_KEY = "warm-up-not-a-key"  # no key's secret hashes like this one: the lookup finds nothing
WARM_UP_PASSES = 2  # the second pass runs the code the first one specialised (Python 3.11+)


def _submission(handler: OneHopASGIHandler) -> None:
    """A ``POST /api/v1/jobs`` that is answered 401 on every request thread, then the body's
    validation and tokenization (a prompt and a chat). Nothing is written anywhere."""
    from django.conf import settings
    from django.utils import timezone

    from api.errors import ServiceUnavailable
    from api.serializers import JobCreateSerializer
    from api.tokenization import get_tokenizer

    body = json.dumps({"prompt": "warm up", "max_tokens": 1}).encode()
    # https where the process redirects plain http (SECURE_SSL_REDIRECT): the redirect would
    # answer before the views.
    scheme = "https" if getattr(settings, "SECURE_SSL_REDIRECT", False) else "http"
    scope = _post_scope("/api/v1/jobs", body, host=_allowed_host(settings.ALLOWED_HOSTS), scheme=scheme)
    request_log = logging.getLogger("django.request")
    level = request_log.level
    request_log.setLevel(logging.ERROR)  # the 401s are the warm-up's own, not a client's
    try:
        for _ in range(WARM_UP_PASSES):
            statuses = {response.status_code for response in handler.respond_on_each_thread(scope, body)}
            if statuses != {401}:
                raise RuntimeError(f"the warm-up's POST was answered {sorted(statuses)}, not 401")
    finally:
        request_log.setLevel(level)
    timezone.get_default_timezone()  # read from the zoneinfo files when first asked for
    try:
        tokenizer = get_tokenizer()
    except ServiceUnavailable:
        return  # the model folder is unreadable (logged at start); submissions answer 503 until it is
    bodies = [{"prompt": "warm up", "max_tokens": 1}]
    if tokenizer.has_chat_template:  # a base model takes no messages (a 400)
        bodies.append({"messages": [{"role": "user", "content": "warm up"}], "max_tokens": 1})
    for data in bodies:
        for _ in range(WARM_UP_PASSES):
            serializer = JobCreateSerializer(data=data)
            serializer.is_valid(raise_exception=True)
            if "messages" in serializer.validated_data:
                tokenizer.encode_messages([dict(m) for m in serializer.validated_data["messages"]])
            else:
                tokenizer.encode_prompt(serializer.validated_data["prompt"])


def _rehearsal() -> None:
    """The submission's database call, rolled back, on the connection this request thread is
    handed (services/job_insert.py, ``job_insert_rehearsal``): each pooled connection's backend
    has then run it before a client's job does. Nothing is written. Skipped where a request's
    connection is closed at its end (no pool, no ``CONN_MAX_AGE``): no backend would be reused."""
    from django.db import close_old_connections, connection

    from api.services.job_insert import job_insert_rehearsal

    db = connection.settings_dict
    if not db.get("OPTIONS", {}).get("pool") and db.get("CONN_MAX_AGE", 0) == 0:
        return
    try:
        job_insert_rehearsal()
    finally:
        close_old_connections()  # as at a request's end: back to the pool, or kept (CONN_MAX_AGE)


def _allowed_host(allowed: list[str]) -> str:
    """A Host header the process accepts (a ``.example.com`` entry allows ``example.com``)."""
    for host in allowed:
        if host == "*":
            return "localhost"
        if host:
            return host.lstrip(".")
    return "localhost"  # DEBUG with no ALLOWED_HOSTS: Django allows localhost


def _post_scope(path: str, body: bytes, *, host: str, scheme: str) -> dict:
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": scheme,
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"host", host.encode("latin-1")), (b"authorization", f"Bearer {WARM_UP_KEY}".encode()),
                    (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 0), "server": (host, 443 if scheme == "https" else 80),
    }
