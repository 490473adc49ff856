"""WebSocket URL patterns (filled in with the streaming consumers)."""

from __future__ import annotations

websocket_urlpatterns: list = []
