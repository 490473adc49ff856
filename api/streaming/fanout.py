"""Live fan-out to the channel layer from plain threads.

channels_redis keeps its connection pools per event loop, so calling ``async_to_sync`` from a
thread would open new connections on every call. This keeps one event loop on its own thread for
the process's lifetime and runs the group sends there.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Coroutine
from typing import Any

from channels.layers import DEFAULT_CHANNEL_LAYER, channel_layers, get_channel_layer
from channels_redis.core import RedisChannelLayer

from api.streaming.group_batch import group_send_many

logger = logging.getLogger(__name__)


class GroupSender:
    """Sends channel-layer group messages from sync code, in the order given."""

    def __init__(self, layer: Any = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="group-sender", daemon=True)
        self._thread.start()
        self._layer = layer if layer is not None else get_channel_layer()

    def send(self, messages: list[tuple[str, dict[str, Any]]], timeout: float = 10.0) -> None:
        """Send ``(group, message)`` pairs and wait for them (so batches stay in order)."""
        if messages and self._layer is not None:
            self._run(self._send_all(messages), timeout)

    async def _send_all(self, messages: list[tuple[str, dict[str, Any]]]) -> None:
        if isinstance(self._layer, RedisChannelLayer):
            await group_send_many(self._layer, messages)
        else:
            await asyncio.gather(*(self._layer.group_send(group, message) for group, message in messages))

    def _run(self, coro: Coroutine[Any, Any, None], timeout: float) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def close(self) -> None:
        """Stop the loop (at process shutdown; open connections die with the process)."""
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5.0)


_process_sender: GroupSender | None = None
_process_sender_lock = threading.Lock()


def process_group_sender() -> GroupSender:
    """This process's GroupSender, started on first use (a web process needs one only for the
    rare event it publishes itself, such as a queued job's cancellation). It has a channel layer
    of its own: the process's layer keeps a connection pool per event loop, and closing it
    (``flush()``) from the process's loop would try to close this thread's pool too."""
    global _process_sender
    with _process_sender_lock:
        if _process_sender is None:
            _process_sender = GroupSender(layer=channel_layers.make_backend(DEFAULT_CHANNEL_LAYER))
        return _process_sender
