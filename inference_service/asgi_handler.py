"""Django's ASGI handler, serving each request in one hop to a fixed pool of request threads.

Django's own ``ASGIHandler`` costs a busy web process far more than the view does:

* it builds the middleware chain in async mode, and every ``MiddlewareMixin`` middleware then
  runs its ``process_request`` and ``process_response`` through ``sync_to_async``: a dozen
  hand-offs between the event loop and a worker thread per request with our seven middleware;
* every request gets a ``ThreadSensitiveContext``: a new thread to run its sync code, and at the
  end one more thread to join that one. ``Thread.start`` blocks the event loop until the new
  thread holds the GIL, which under load is a switch interval or more, twice per request
  (profiled: 7 % of a submitting daphne's samples).

Here, as under a threaded WSGI server, the chain is loaded in sync mode and the sync part of a
request runs as one call on one of ``WEB_REQUEST_THREADS`` long-lived threads: the
``request_started`` signal (``close_old_connections`` for that thread's connections), the
middleware chain with the view, and for a complete (non-streaming) response its ``close()``
(``request_finished``: the thread's connections are closed or returned to the pool, as Django
does at the end of any request). Only then does the event loop send the response. A streaming
response is sent first and closed on the same thread afterwards. Behaviour is Django's: same
middleware, same order, same exception handling (``convert_exception_to_response`` wraps each
layer), same signals. What differs: at most ``WEB_REQUEST_THREADS`` requests run their sync part at
once (the rest wait their turn instead of each taking a thread), and with ``DB_CONN_MAX_AGE`` set a
thread keeps its database connection between requests, as in WSGI. An async view, should one
ever be added, still works: the sync chain calls it through ``async_to_sync``.
"""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.http import FileResponse, HttpResponse
from django.urls import set_script_prefix

_WARM_UP_WAIT_S = 30.0
T = TypeVar("T")


class OneHopASGIHandler(ASGIHandler):
    def __init__(self, threads: int = 8) -> None:
        super().__init__()
        # ASGIHandler.__init__ loaded an async chain; replace it with the sync one.
        self.load_middleware(is_async=False)
        self.threads = threads
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="django-request")

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        try:
            loop = asyncio.get_running_loop()
            response = await loop.run_in_executor(self._executor, self._respond, scope, body_file)
            try:
                await self.send_response(response, send)
            except asyncio.CancelledError:
                pass  # the client went away while we were sending
            finally:
                if not response.closed:  # a streaming response: close it on a request thread too
                    await loop.run_in_executor(self._executor, response.close)
        finally:
            body_file.close()

    def respond_on_each_thread(self, scope, body: bytes) -> list[HttpResponse]:
        """The sync part of one request per request thread, all at once, with no event loop: the
        web warm-up's way in (inference_service/warmup.py). Each thread pays its own first-use
        costs (its database connection wrapper, the pool's connection it is handed)."""
        return self.run_on_each_thread(lambda: self._respond(scope, io.BytesIO(body)))

    def run_on_each_thread(self, fn: Callable[[], T]) -> list[T]:
        """``fn()`` once on every request thread, all at once (the web warm-up's); its results."""
        # Every copy waits for all the others before it runs, so each takes a thread of its own.
        barrier = threading.Barrier(self.threads, timeout=_WARM_UP_WAIT_S)

        def run() -> T:
            barrier.wait()
            return fn()

        futures = [self._executor.submit(run) for _ in range(self.threads)]
        return [future.result() for future in futures]

    def _respond(self, scope, body_file) -> HttpResponse:
        """The sync part of a request, on a request thread (see the module docstring)."""
        # Set here, not on the event loop: the prefix lives in this thread's context, where
        # reverse() and redirects read it.
        set_script_prefix(get_script_prefix(scope))
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, response = self.create_request(scope, body_file)
        if request is not None:
            response = self.get_response(request)
            response._handler_class = self.__class__
            if isinstance(response, FileResponse):
                response.block_size = self.chunk_size
        if not response.streaming:
            response.close()
        return response
