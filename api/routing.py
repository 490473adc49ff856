"""WebSocket URL patterns (mounted by inference_service.asgi)."""

from __future__ import annotations

from django.urls import path

from api.consumers import GenerateConsumer, JobStreamConsumer

websocket_urlpatterns = [
    path("ws/v1/jobs/<uuid:job_id>/", JobStreamConsumer.as_asgi()),
    path("ws/v1/generate", GenerateConsumer.as_asgi()),
]
