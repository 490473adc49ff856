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
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)


def warm_up_http() -> list[str]:
    """The request path's one-time costs, on this thread; returns the steps not done (failed, or
    skipped because one they need failed)."""
    started = time.perf_counter()
    failed = [step.__name__ for step in (_routes, _database, _redis) if not _best_effort(step)]
    # The broker is REDIS_URL's Redis: with it down, kombu's connection retries would only hold
    # the process's start up (6 s on the dev VM).
    if "_redis" in failed or not _best_effort(_celery):
        failed.append("_celery")
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


def _best_effort(step: Callable[[], None]) -> bool:
    try:
        step()
    except Exception:  # noqa: BLE001 - best effort: the first request pays instead
        logger.warning("web warm-up: %s failed; the first request pays for it", step.__name__, exc_info=True)
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
    from api.tasks import ENGINE_QUEUE, run_job
    from inference_service.celery import app

    app.finalize(auto=True)
    run_job.backend  # noqa: B018 - loaded on first use; one per thread after this, cheaply
    with app.producer_or_acquire() as producer:
        producer.maybe_declare(app.amqp.queues[ENGINE_QUEUE])
