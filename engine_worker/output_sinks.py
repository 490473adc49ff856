"""Where the engine thread puts a request's outputs: an asyncio collector or a blocking waiter."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

from engine_worker.request import RequestOutput


def merge_outputs(older: RequestOutput, newer: RequestOutput) -> RequestOutput:
    """One output covering both steps: the new pieces concatenated, the totals from ``newer``."""
    return dataclasses.replace(
        newer,
        new_token_ids=older.new_token_ids + newer.new_token_ids,
        new_text=older.new_text + newer.new_text,
    )


class AsyncCollector:
    """A request's outputs for a consumer on one asyncio loop.

    ``put`` runs on the loop's thread (the engine schedules it with ``call_soon_threadsafe``).
    Outputs not yet taken are merged, so a slow consumer gets one combined output instead of a
    backlog. The consumer is woken every ``stream_interval`` tokens, and always on the last output.
    """

    __slots__ = ("loop", "stream_interval", "abandoned", "_pending", "_event", "_last_sent")

    def __init__(self, loop: asyncio.AbstractEventLoop, stream_interval: int = 1) -> None:
        self.loop = loop
        self.stream_interval = stream_interval
        self.abandoned = False  # aborted through the API: drop it once its last output arrives
        self._pending: RequestOutput | None = None
        self._event = asyncio.Event()
        self._last_sent = 0

    def put(self, out: RequestOutput) -> None:
        pending = self._pending
        self._pending = out if pending is None else merge_outputs(pending, out)
        if (
            out.finished
            or self.stream_interval == 1
            or out.completion_tokens - self._last_sent >= self.stream_interval
        ):
            self._event.set()

    async def get(self) -> RequestOutput:
        while self._pending is None or not self._event.is_set():
            self._event.clear()
            await self._event.wait()
        out, self._pending = self._pending, None
        self._event.clear()
        self._last_sent = out.completion_tokens
        return out


class SyncWaiter:
    """Collects the final outputs of a group of requests for a blocking caller (any thread)."""

    def __init__(self, request_ids: list[str]) -> None:
        self._remaining = set(request_ids)
        self.finals: dict[str, RequestOutput] = {}
        self._done = threading.Event()
        if not self._remaining:
            self._done.set()

    def put(self, out: RequestOutput) -> None:
        if out.finished and out.request_id in self._remaining:
            self.finals[out.request_id] = out
            self._remaining.discard(out.request_id)
            if not self._remaining:
                self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)
