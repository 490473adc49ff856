"""WebSocket URL patterns, and the HTTP paths Channels serves instead of Django (mounted by
inference_service.asgi)."""

from __future__ import annotations

from django.urls import path, re_path

from api.openai_api.consumer import ChatCompletionConsumer, TextCompletionConsumer
from api.streaming.consumers import GenerateConsumer, JobStreamConsumer, UnknownPathConsumer
from api.streaming.sse import JobEventsConsumer

websocket_urlpatterns = [
    path("ws/v1/jobs/<uuid:job_id>/", JobStreamConsumer.as_asgi()),
    path("ws/v1/generate", GenerateConsumer.as_asgi()),
    re_path(r"", UnknownPathConsumer.as_asgi()),  # last: every other path gets a 4404, not a 500
]

# Long-lived HTTP responses: a consumer on the event loop, not a Django request thread per stream.
http_stream_urlpatterns = [
    path("api/v1/jobs/<uuid:job_id>/events", JobEventsConsumer.as_asgi()),
    # OpenAI-compatible completions: a response waits for (or streams) its job.
    path("v1/chat/completions", ChatCompletionConsumer.as_asgi()),
    path("v1/completions", TextCompletionConsumer.as_asgi()),
]
