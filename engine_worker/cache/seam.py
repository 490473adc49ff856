"""The scheduler's side of the prefix-cache seam (see :mod:`engine_worker.cache.protocol`).

A back end that pins what it serves (the paged cache's blocks) may offer
``fetch_for(request_id, tokens)`` and ``release(request_id)``: the seam then fetches on behalf of
the request, and the scheduler releases it once, when the request finishes, fails or is aborted
(:meth:`PrefixSeam.release`), so nothing it was served from is evicted while it runs.

A cache is an optimisation: whatever goes wrong inside a back end, the request runs uncached and
the error is counted; it never fails a request or the engine.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from engine_worker.cache import kv
from engine_worker.cache.protocol import NoPrefixCache, PrefixCacheBackend
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
        # Optional per-request pinning (both or neither).
        fetch_for = getattr(backend, "fetch_for", None)
        release = getattr(backend, "release", None)
        pins = backend.active and callable(fetch_for) and callable(release)
        self._fetch_for = fetch_for if pins else None
        self._release = release if pins else None
        # Optional: a back end with a byte limit the scheduler can lower and raise.
        limit = getattr(backend, "set_byte_limit", None)
        self._set_byte_limit = limit if backend.active and callable(limit) else None

    @property
    def active(self) -> bool:
        return self.backend.active

    def lookup(self, request: Request) -> None:
        """Set ``prompt_cache``, ``remaining_tokens``, ``cached_tokens``, ``cache_hit_type``."""
        tokens = request.prompt_token_ids
        rid = request.request_id
        try:
            if self._fetch_for is not None:
                self._release(rid)  # a request looked up again (SSD wait) holds one set of pins
                cache, remaining, hit_type = self._fetch_for(rid, tokens)
            else:
                cache, remaining, hit_type = self.backend.fetch(tokens)
        except Exception:
            logger.exception("prefix cache lookup failed for %s; running it uncached", request.request_id)
            self.errors += 1
            cache, remaining, hit_type = None, tokens, "miss"
        remaining = list(remaining)
        if cache is not None and not all(hasattr(layer, "merge") for layer in cache):
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

    def store(self, request_id: str, tokens: Sequence[int], cache: list[Any]) -> None:
        try:
            self.backend.store(tokens, cache)
        except Exception:  # a failed store only loses a future hit
            logger.exception("prefix cache store failed for %s", request_id)
            self.errors += 1

    def release(self, request_id: str) -> None:
        """The request finished, failed or was aborted: unpin what it was served from."""
        if self._release is None:
            return
        try:
            self._release(request_id)
        except Exception:
            logger.exception("prefix cache release failed for %s", request_id)
            self.errors += 1

    @property
    def bytes_used(self) -> int:
        """Bytes the back end holds in device memory (0 when it does not say)."""
        return int(getattr(self.backend, "bytes_used", 0) or 0) if self.backend.active else 0

    def set_byte_limit(self, max_bytes: int) -> None:
        """Let the back end hold at most ``max_bytes`` (within its own limit); it evicts to fit."""
        if self._set_byte_limit is None:
            return
        try:
            self._set_byte_limit(max_bytes)
        except Exception:  # an eviction that fails leaves entries; the budget checks count them
            logger.exception("prefix cache could not shrink to %d bytes", max_bytes)
            self.errors += 1

    def stats(self) -> dict[str, Any] | None:
        return self.backend.get_stats() if self.backend.active else None

    def clear(self) -> bool:
        self.backend.clear()
        return self.backend.active

    def save(self, cache_dir: str) -> bool:
        save = getattr(self.backend, "save_to_disk", None)
        if save is None:
            logger.info("the prefix cache back end cannot be saved to disk")
            return False
        return bool(save(cache_dir))

    def load(self, cache_dir: str) -> int:
        load = getattr(self.backend, "load_from_disk", None)
        if load is None:
            logger.info("the prefix cache back end cannot be loaded from disk")
            return 0
        return int(load(cache_dir))

    def close(self) -> None:
        """Close the back end's disk tier, if any (it flushes pending writes)."""
        tier = getattr(self.backend, "ssd_tier", None)
        if tier is not None:
            tier.close()


def _reopen_exact_hit(cache: list[Any], tokens: list[int]) -> tuple[list[Any] | None, list[int]]:
    """An exact hit covers the whole prompt, but the generator needs at least one token to
    compute the next token's logits from: trim one token off the cache and feed it again, or,
    when the cache cannot be trimmed (rotating/recurrent), drop the hit."""
    if kv.trimmable(cache) and kv.trim(cache, 1) == 1:
        return cache, tokens[-1:]
    return None, list(tokens)
