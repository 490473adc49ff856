"""The scheduler's side of the prefix-cache seam (see :mod:`engine_worker.cache.protocol`).

The seam fetches on behalf of a request (``fetch_for``), and the scheduler releases it once, when
the request finishes, fails or is aborted (:meth:`PrefixSeam.release`): a back end that pins what
it serves (the paged cache's blocks) then never evicts them while the request runs.

A cache is an optimisation: whatever goes wrong inside a back end, the request runs uncached and
the error is counted; it never fails a request or the engine.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from engine_worker.cache import kv
from engine_worker.cache.protocol import NoPrefixCache, PrefixCacheBackend
from engine_worker.cache.turns import TurnStore
from engine_worker.common.config import SchedulerConfig
from engine_worker.common.request import Request

logger = logging.getLogger(__name__)


def default_backend(model: Any, config: SchedulerConfig, max_bytes: int | None = None) -> PrefixCacheBackend:
    """The back end the config's cache fields ask for, holding at most ``max_bytes`` (the share of
    the worker's memory budget it gets); :class:`NoPrefixCache` when off."""
    if not config.enable_prefix_cache:
        return NoPrefixCache()
    from engine_worker.cache.factory import build_prefix_cache

    return build_prefix_cache(model, config, max_bytes) or NoPrefixCache()


class PrefixSeam:
    """Asks the back end at admission and offers it finished requests' caches."""

    def __init__(self, backend: PrefixCacheBackend) -> None:
        self.backend = backend
        self.errors = 0
        self._turns = TurnStore(backend)

    @property
    def active(self) -> bool:
        return self.backend.active

    def lookup(self, request: Request) -> None:
        """Set ``prompt_cache``, ``remaining_tokens``, ``cached_tokens``, ``cache_hit_type``."""
        tokens = request.prompt_ids
        rid = request.request_id
        try:
            self.backend.release(rid)  # a request looked up again (SSD wait) holds one set of pins
            cache, remaining, hit_type = self.backend.fetch_for(rid, tokens)
        except Exception:
            logger.exception("prefix cache lookup failed for %s; running it uncached", request.request_id)
            self.errors += 1
            cache, remaining, hit_type = None, tokens, "miss"
        remaining = list(remaining)
        if cache is not None and not kv.batchable(cache):
            # The generator batches a cache by merging it; one that cannot merge (e.g. a
            # QuantizedKVCache) would fail the whole batch's next step, so the hit is dropped.
            logger.warning("prefix cache hit for %s is not batchable; running it uncached", request.request_id)
            self.errors += 1
            cache = None
        if cache is not None and not remaining:
            cache, remaining = _reopen_exact_hit(cache, tokens)
        if cache is None:
            remaining = list(tokens)
            self.release(rid)  # nothing served: nothing to pin
        request.prompt_cache = cache
        request.remaining_tokens = remaining
        request.cached_tokens = len(tokens) - len(remaining)
        # "ssd_pending" is kept on a miss: the scheduler may hold the request for the disk read.
        request.cache_hit_type = hit_type if cache is not None or hit_type == "ssd_pending" else "miss"

    def store_finished(self, finished: Sequence[tuple[Request, Sequence[int], list[Any]]]) -> None:
        """Offer the caches of the requests that finished in one step, ``(request, tokens,
        cache)`` with ``tokens`` its prompt and reply: each stored as the latest reply to its
        prompt (:mod:`engine_worker.cache.turns`), all their copies in one evaluation."""
        try:
            self._turns.store_many([(r.prompt_token_ids or [], tokens, cache) for r, tokens, cache in finished])
        except Exception:  # a failed store only loses future hits
            logger.exception("prefix cache store failed for %d finished requests", len(finished))
            self.errors += 1

    def release(self, request_id: str) -> None:
        """The request finished, failed or was aborted: unpin what it was served from."""
        try:
            self.backend.release(request_id)
        except Exception:
            logger.exception("prefix cache release failed for %s", request_id)
            self.errors += 1

    @property
    def bytes_used(self) -> int:
        """Bytes the back end holds in device memory (0 when it does not count them)."""
        return self.backend.bytes_used if self.backend.active else 0

    def set_byte_limit(self, max_bytes: int) -> None:
        """Let the back end hold at most ``max_bytes`` (within its own limit); it evicts to fit."""
        if not self.backend.active:
            return
        try:
            self.backend.set_byte_limit(max_bytes)
        except Exception:  # an eviction that fails leaves entries; the budget checks count them
            logger.exception("prefix cache could not shrink to %d bytes", max_bytes)
            self.errors += 1

    def stats(self) -> dict[str, Any] | None:
        return self.backend.get_stats() if self.backend.active else None

    def clear(self) -> bool:
        self.backend.clear()
        return self.backend.active

    def save(self, cache_dir: str) -> bool:
        return self.backend.save_to_disk(cache_dir)

    def load(self, cache_dir: str) -> int:
        return self.backend.load_from_disk(cache_dir)

    def close(self) -> None:
        """Close the back end's disk tier, if any (it flushes pending writes)."""
        self.backend.close()


def _reopen_exact_hit(cache: list[Any], tokens: list[int]) -> tuple[list[Any] | None, list[int]]:
    """An exact hit covers the whole prompt, but the generator needs at least one token to
    compute the next token's logits from: trim one token off the cache and feed it again, or,
    when the cache cannot be trimmed (rotating/recurrent), drop the hit."""
    if kv.trimmable(cache) and kv.trim(cache, 1) == 1:
        return cache, tokens[-1:]
    return None, list(tokens)
