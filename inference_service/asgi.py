"""ASGI entry point: HTTP goes to Django, WebSockets to the Channels consumers in api.routing."""

from __future__ import annotations

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inference_service.settings")

# Django must be set up before anything imports models (the consumers do).
django.setup(set_prefix=False)

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.urls import re_path  # noqa: E402

from api.routing import http_stream_urlpatterns, websocket_urlpatterns  # noqa: E402
from api.tokenization import load_tokenizer_at_start  # noqa: E402
from inference_service.asgi_handler import OneHopASGIHandler  # noqa: E402

django_http = OneHopASGIHandler(threads=settings.WEB_REQUEST_THREADS)
load_tokenizer_at_start()
if settings.WEB_WARM_UP:
    from inference_service import warmup

    warmup.warm_up_http(django_http)
    warmup.schedule_websocket_warm_up()

http_app = ASGIStaticFilesHandler(django_http) if settings.SERVE_STATIC else django_http

# No AuthMiddlewareStack: WebSocket clients authenticate with API keys inside the consumers.
application = ProtocolTypeRouter(
    {
        # The job event streams (server-sent events) first, everything else to Django.
        "http": URLRouter([*http_stream_urlpatterns, re_path(r"", http_app)]),
        "websocket": URLRouter(websocket_urlpatterns),
    }
)
