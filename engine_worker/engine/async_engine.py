"""AsyncEngineCore: the seed's ``async with`` wrapper around :class:`EngineCore`.

Unlike the seed's, leaving the ``async with`` block also closes the engine (releases the model).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from engine_worker.common.config import EngineConfig
from engine_worker.common.request import RequestOutput, SamplingParams
from engine_worker.engine.core import EngineCore


class AsyncEngineCore:
    """``async with AsyncEngineCore(model, tokenizer, config) as engine:`` starts the engine thread
    and, on exit, stops it and closes the engine."""

    def __init__(self, model: Any, tokenizer: Any, config: EngineConfig | None = None) -> None:
        self.engine = EngineCore(model, tokenizer, config)

    async def __aenter__(self) -> AsyncEngineCore:
        await self.engine.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.engine.stop()
        self.engine.close()

    def start(self) -> None:
        self.engine.start()

    async def stop(self) -> None:
        await self.engine.stop()

    def close(self) -> None:
        self.engine.close()

    async def add_request(self, prompt: str | list[int], sampling_params: SamplingParams | None = None,
                          request_id: str | None = None, **kwargs: Any) -> str:
        return await self.engine.add_request(prompt, sampling_params, request_id, **kwargs)

    async def abort_request(self, request_id: str) -> bool:
        return await self.engine.abort_request(request_id)

    async def stream_outputs(self, request_id: str, timeout: float | None = None) -> AsyncIterator[RequestOutput]:
        async for out in self.engine.stream_outputs(request_id, timeout):
            yield out

    async def generate(self, prompt: str | list[int], sampling_params: SamplingParams | None = None,
                       request_id: str | None = None, **kwargs: Any) -> RequestOutput:
        return await self.engine.generate(prompt, sampling_params, request_id, **kwargs)

    def generate_batch_sync(self, prompts: list[str | list[int]],
                            sampling_params: SamplingParams | None = None) -> list[RequestOutput]:
        return self.engine.generate_batch_sync(prompts, sampling_params)

    def get_stats(self) -> dict[str, Any]:
        return self.engine.get_stats()

    def get_cache_stats(self) -> dict[str, Any] | None:
        return self.engine.get_cache_stats()

    def save_cache_to_disk(self, cache_dir: str) -> bool:
        return self.engine.save_cache_to_disk(cache_dir)

    def load_cache_from_disk(self, cache_dir: str) -> int:
        return self.engine.load_cache_from_disk(cache_dir)

    def clear_runtime_caches(self) -> dict[str, bool]:
        return self.engine.clear_runtime_caches()

    def clear_prefix_cache(self) -> None:
        self.engine.clear_prefix_cache()
