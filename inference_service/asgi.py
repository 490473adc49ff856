"""ASGI entry point (daphne): HTTP to Django's own handler, except the job event streams; WebSockets
to the Channels consumers of api.streaming.routing.

Loading it is a web process's start: it also loads the prompt tokenizer (api/serving/tokenization.py), so
that no client's first submission waits seconds for it.
"""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inference_service.settings")
# Sets Django up, which the consumers' imports of the models below need.
django_http = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.urls import re_path  # noqa: E402

from api.serving.tokenization import load_tokenizer_at_start  # noqa: E402
from api.streaming.routing import http_stream_urlpatterns, websocket_urlpatterns  # noqa: E402

load_tokenizer_at_start()

http_app = ASGIStaticFilesHandler(django_http) if settings.SERVE_STATIC else django_http

# No AuthMiddlewareStack: WebSocket clients authenticate with API keys inside the consumers.
application = ProtocolTypeRouter(
    {
        # The job event streams (server-sent events) first, everything else to Django.
        "http": URLRouter([*http_stream_urlpatterns, re_path(r"", http_app)]),  # type: ignore[arg-type]  # channels' URLRouter routes ASGI apps
        "websocket": URLRouter(websocket_urlpatterns),
    }
)
