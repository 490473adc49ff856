"""The seed's asyncio request API of :class:`~engine_worker.engine.core.EngineCore`.

``add_request`` registers a per-request :class:`AsyncCollector` on the caller's loop; the engine
thread fills it once per step; ``stream_outputs`` and ``generate`` drain it. A consumer that stops
early, times out or is cancelled aborts its request, so no orphan keeps generating.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import AsyncIterator, Generator
from typing import Any

from engine_worker.common.config import EngineConfig
from engine_worker.common.request import Request, RequestOutput, SamplingParams
from engine_worker.engine.collectors import AsyncCollector, SyncWaiter

logger = logging.getLogger(__name__)


class Done:
    """An already-finished awaitable, so the engine's synchronous ``start``/``stop`` can also be
    awaited, as the seed's are."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        yield from ()


class AsyncRequestAPI:
    """Mixed into EngineCore, which provides the thread-safe registration used here."""

    config: EngineConfig
    _cond: threading.Condition
    _collectors: dict[str, AsyncCollector]

    def _register(self, request: Request, collector: AsyncCollector | None = None,
                  waiter: SyncWaiter | None = None) -> None:
        raise NotImplementedError  # provided by EngineCore

    def abort(self, request_id: str) -> bool:
        raise NotImplementedError  # provided by EngineCore

    async def add_request(
        self,
        prompt: str | list[int],
        sampling_params: SamplingParams | None = None,
        request_id: str | None = None,
        images: list[Any] | None = None,
        videos: list[Any] | None = None,
        prefix_boundary: int = 0,
        priority: int = 0,
    ) -> str:
        """Queue a request whose outputs are read with ``stream_outputs`` or ``generate``.

        ``prefix_boundary`` is recorded on the request for the prefix cache. ``images``/``videos``
        make the request finish with ``finish_reason="error"`` (this engine serves text models).
        Raises :class:`~engine_worker.common.errors.DuplicateRequest` while the id is in use and
        :class:`~engine_worker.common.errors.EngineClosed` after ``close()``.
        """
        request = Request(
            request_id or str(uuid.uuid4()), prompt, sampling_params or SamplingParams(),
            priority=priority, images=images, videos=videos, prefix_boundary=prefix_boundary,
        )
        collector = AsyncCollector(asyncio.get_running_loop(), self.config.stream_interval)
        self._register(request, collector=collector)
        return request.request_id

    async def abort_request(self, request_id: str) -> bool:
        with self._cond:
            collector = self._collectors.get(request_id)
            if collector is not None:
                collector.abandoned = True
        return self.abort(request_id)

    def _cleanup(self, request_id: str) -> None:
        with self._cond:
            self._collectors.pop(request_id, None)

    async def stream_outputs(self, request_id: str, timeout: float | None = None) -> AsyncIterator[RequestOutput]:
        """Yield the request's outputs until the finished one. ``timeout`` is an inactivity limit
        in seconds: when no output arrives for that long, or the consumer stops iterating, the
        request is aborted so no orphan keeps generating."""
        collector = self._collectors.get(request_id)
        if collector is None:
            logger.warning("stream_outputs: no request %s", request_id)
            return
        finished = False
        try:
            while True:
                if timeout:
                    out = await asyncio.wait_for(collector.get(), timeout)
                else:
                    out = await collector.get()
                finished = out.finished
                yield out
                if finished:
                    return
        except TimeoutError:
            logger.warning("request %s produced nothing for %ss; aborting it", request_id, timeout)
        finally:
            if not finished:
                self.abort(request_id)
            self._cleanup(request_id)

    async def generate(
        self,
        prompt: str | list[int],
        sampling_params: SamplingParams | None = None,
        request_id: str | None = None,
        **kwargs: Any,
    ) -> RequestOutput:
        """Run one request to the end and return its final output (cumulative text and tokens)."""
        rid = await self.add_request(prompt, sampling_params, request_id, **kwargs)
        collector = self._collectors[rid]
        finished = False
        try:
            while True:
                out = await collector.get()
                if out.finished:
                    finished = True
                    return out
        finally:
            if not finished:
                self.abort(rid)
            self._cleanup(rid)
