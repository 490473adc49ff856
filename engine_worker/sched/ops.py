"""The scheduler's operator side (seed API): stats, the prefix cache's management, resets.

A mixin of :class:`engine_worker.sched.scheduler.Scheduler`, kept apart so the step function's file stays
readable; it works on the scheduler's own state, named below. Like the rest of the scheduler it is
not thread-safe: ``EngineCore`` calls these between steps, under its step lock.
"""

from __future__ import annotations

import gc
import time
from typing import TYPE_CHECKING, Any

from engine_worker.cache.hooks import CacheLifecycle
from engine_worker.cache.protocol import PrefixCacheBackend
from engine_worker.cache.seam import PrefixSeam
from engine_worker.common.request import Request, RequestOutput
from engine_worker.runner import device_memory
from engine_worker.runner.generator import BatchRunner
from engine_worker.runner.text_stream import TextStream
from engine_worker.sched.stats import SchedulerCounters, request_rows
from engine_worker.sched.waiting_queue import WaitingQueue


class SchedulerOps:
    """Stats, cache management and resets of one scheduler."""

    model: Any
    prefix_cache: PrefixCacheBackend
    mtp_status: dict[str, Any] | None
    requests: dict[str, Request]
    running: dict[str, Request]
    waiting: WaitingQueue
    counters: SchedulerCounters
    runner: BatchRunner | None
    request_id_to_uid: dict[str, int]
    uid_to_request_id: dict[int, str]
    finished_req_ids: set[str]
    _cache: PrefixSeam
    _lifecycle: CacheLifecycle
    _streams: dict[str, TextStream]
    _live_by_uid: dict[int, tuple[Request, TextStream]]
    _logprobs_by_uid: dict[int, int]
    _prefilling: set[int]
    _first_tokens_due: int
    _pending_outputs: list[RequestOutput]

    if TYPE_CHECKING:  # provided by the scheduler and its other mixins
        def abort_request(self, request_id: str) -> bool: ...
        def _memory_use(self) -> dict[str, int]: ...

    def get_running_requests_info(self) -> list[dict[str, Any]]:
        """Dashboard rows with exactly the seed's fields: waiting requests, then running ones."""
        return request_rows(list(self.waiting), list(self.running.values()), time.time())

    def get_stats(self) -> dict[str, Any]:
        c = self.counters
        stats: dict[str, Any] = {
            "num_waiting": len(self.waiting),
            "num_running": len(self.running),
            # Requests the batch may run at once now (the generator's capacity, lowered while the
            # memory guard caps it): beyond it, admitted work waits.
            "max_running": self._guard.cap(self.config.max_running),
            "num_requests_processed": c.num_requests_processed,
            "total_prompt_tokens": c.total_prompt_tokens,
            "total_completion_tokens": c.total_completion_tokens,
            "counters": {**c.as_dict(), "num_cache_errors": self._cache.errors},
        }
        stats["memory"] = mem = device_memory.memory_stats()
        mem.update(self._memory_use())
        stats.update(device_memory.seed_memory_keys(mem))
        if self.mtp_status is not None:
            stats["mtp"] = dict(self.mtp_status)
        cache_stats = self._cache.stats()
        if cache_stats is not None:
            stats[self.prefix_cache.name] = cache_stats
        return stats

    def get_cache_stats(self) -> dict[str, Any] | None:
        return self._cache.stats()

    def list_cache_entries(self) -> list[dict[str, Any]]:
        """Operator view: one row per prefix-cache entry (key_hash, tokens, bytes, tier,
        hit_count, last_used, quantized); empty without a cache."""
        return self._lifecycle.list_entries()

    def evict_cache_entry(self, key: str) -> bool:
        """Drop one prefix-cache entry (every tier) by its ``key_hash``; False if unknown."""
        return self._lifecycle.evict(key)

    # ----------------------------------------------------------------- caches and resets

    def clear_runtime_caches(self) -> dict[str, bool]:
        """Clear the prefix cache and the allocator cache; requests are untouched."""
        result = {"paged_cache": False, "memory_aware_cache": False, "prefix_cache": False}
        if self._cache.clear():
            result[self.prefix_cache.name] = True
        device_memory.clear_allocator_cache()
        return result

    def clear_prefix_cache(self) -> None:
        self._cache.clear()

    def save_cache_to_disk(self, cache_dir: str) -> bool:
        return self._cache.save(cache_dir)

    def load_cache_from_disk(self, cache_dir: str) -> int:
        return self._cache.load(cache_dir)

    def close_ssd_tier(self) -> None:
        """Flush and stop the prefix cache's SSD tier, if it has one (seed API; ``deep_reset``
        does it too)."""
        self._cache.close()

    def reset(self) -> None:
        """Abort every request, drop the generator, clear the caches and the counters' queues."""
        # Detached while aborting: the generator is discarded, so nothing is removed from it and
        # no aborted prefix is stored (the cache is cleared below; after a failure it is suspect).
        runner, self.runner = self.runner, None
        for rid in list(self.requests):
            self.abort_request(rid)
        self.runner = runner
        self.requests.clear()
        self.waiting.clear()
        self.running.clear()
        self._streams.clear()
        self._pending_outputs.clear()
        self.request_id_to_uid.clear()
        self.uid_to_request_id.clear()
        self._live_by_uid.clear()
        self._logprobs_by_uid.clear()
        self.finished_req_ids = set()
        self.close()
        self.clear_runtime_caches()

    def deep_reset(self) -> None:
        """``reset()`` plus dropping every cache reference the model may hold, and closing the
        prefix cache's disk tier (it flushes pending writes)."""
        self.reset()
        self._cache.close()
        for obj in [self.model, *getattr(self.model, "layers", [])]:
            for holder in (obj, getattr(obj, "self_attn", None)):
                if holder is not None and hasattr(holder, "cache"):
                    holder.cache = None
        gc.collect()

    def close(self) -> None:
        """Release the generator (on the thread that stepped it)."""
        self._prefilling.clear()  # its uids die with it
        self._first_tokens_due = 0
        runner, self.runner = self.runner, None
        if runner is not None:
            runner.close()
