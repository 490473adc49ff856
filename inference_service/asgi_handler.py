"""Django's ASGI handler with the middleware chain and the view run in one thread hop.

Django's own ``ASGIHandler`` builds the middleware chain in async mode. Every ``MiddlewareMixin``
middleware (all of Django's, all of ours) then runs its ``process_request`` and
``process_response`` through ``sync_to_async``, and the sync view through one more: with the
seven middleware in settings that is a dozen hand-offs between the event loop and a worker
thread per request, each paying a thread wake-up and the GIL. On a loaded 2-core host that was
most of a 404's cost (8 ms of wall time, 2.4 ms of CPU).

Here the chain is loaded in sync mode, as under WSGI, and the whole of ``get_response`` runs in
one ``sync_to_async`` call on the request's thread. Behaviour is Django's: same middleware, same
order, same exception handling (``convert_exception_to_response`` wraps each layer either way),
same per-request thread (``ThreadSensitiveContext`` in ``ASGIHandler.__call__``), so database
connections are opened and closed exactly as before. An async view, should one ever be added,
still works: the sync chain calls it through ``async_to_sync``.
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.http import FileResponse


class OneHopASGIHandler(ASGIHandler):
    def __init__(self) -> None:
        super().__init__()
        # ASGIHandler.__init__ loaded an async chain; replace it with the sync one.
        self.load_middleware(is_async=False)

    async def run_get_response(self, request):
        response = await sync_to_async(self.get_response, thread_sensitive=True)(request)
        response._handler_class = self.__class__
        if isinstance(response, FileResponse):
            response.block_size = self.chunk_size
        return response
