"""The seam between the scheduler and a prefix-cache back end.

The scheduler asks the back end once per request, when it admits the request into the batch
(on the engine thread), and offers it the finished request's KV cache once, when the request
finishes. Back ends live in ``engine_worker.cache``; :class:`NoPrefixCache` is the default.

Contract of :meth:`PrefixCacheBackend.fetch`:

* It returns ``(cache_layers, remaining_tokens, hit_type)``. ``cache_layers`` is ``None`` on a miss,
  otherwise a per-layer cache list that the caller now owns (a copy: the scheduler may trim it and
  the generator merges it into the batch), holding exactly ``len(tokens) - len(remaining_tokens)``
  tokens, which are a prefix of ``tokens``. ``remaining_tokens`` is the suffix still to prefill.
* ``hit_type`` is a short label for dashboards: ``"miss"``, ``"exact"``, ``"prefix"``,
  ``"supersequence"``, ``"lcp"``...
* An exact hit may return ``remaining_tokens == []``; the scheduler then trims one token off the
  cache (when the cache is trimmable) and re-feeds the last prompt token, or drops the hit.

:meth:`store` receives ``tokens`` (prompt plus generated tokens, as the cache holds them) and the
per-layer cache; it must not block on I/O (it runs inside an engine step). :meth:`store_many`
stores the caches of all the requests that finished in one step: a back end that copies device
arrays makes all their copies in one evaluation, so a step that finishes a prefill batch of
one-token requests syncs with the device once, not once per request.

The Protocol lists every method the scheduler calls. Those past ``clear`` are capabilities some
back ends lack (pinning, a byte limit, the operator view, persistence, a disk tier): a back end
subclasses :class:`PrefixCacheBackend` and keeps the trivial default of each one it lacks, as
documented per method, so the scheduler never asks a back end what it can do.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

logger = logging.getLogger(__name__)


class StoreItem(NamedTuple):
    """One cache for :meth:`PrefixCacheBackend.store_many`: ``cache_layers`` stored under
    ``tokens``, then the entry ``replaces`` (a ``key_hash``, or None) dropped as a replaced turn."""

    tokens: Sequence[int]
    cache_layers: list[Any]
    replaces: str | None = None


@runtime_checkable
class PrefixCacheBackend(Protocol):
    """What the scheduler needs from a prefix cache."""

    #: Key of this back end's stats in ``Scheduler.get_stats()`` (seed: ``memory_aware_cache``,
    #: ``paged_cache`` or ``prefix_cache``).
    name: str
    #: False for a back end that never stores (the scheduler then skips extracting caches).
    active: bool
    #: True for a back end that stores a wrapped sliding window whole (under ``max_kv_size``): the
    #: scheduler then also stores a prompt-only snapshot of a request whose prompt wraps it.
    stores_wrapped_windows: bool = False

    def fetch(self, tokens: Sequence[int]) -> tuple[list[Any] | None, list[int], str]: ...

    # What store and clear return is the back end's own (callers through the protocol ignore it).
    def store(self, tokens: Sequence[int], cache_layers: list[Any]) -> object: ...

    def get_stats(self) -> dict[str, Any]: ...

    def clear(self) -> object: ...

    # ---- capabilities with a trivial default -------------------------------------------------

    def store_many(self, items: Sequence[StoreItem]) -> None:
        """For each item in order: :meth:`store`, then :meth:`replace_turn` of its ``replaces``.
        A back end that copies device arrays overrides it to evaluate all the items' copies at
        once (one sync); the entries and evictions must be those of the one-by-one calls.
        Default: the one-by-one calls."""
        for item in items:
            self.store(item.tokens, item.cache_layers)
            if item.replaces is not None:
                self.replace_turn(item.replaces)

    def fetch_for(self, request_id: str, tokens: Sequence[int]) -> tuple[list[Any] | None, list[int], str]:
        """:meth:`fetch` on behalf of a request: what it is served stays pinned (never evicted)
        until :meth:`release` of ``request_id``. Default, for a back end that pins nothing:
        :meth:`fetch`."""
        return self.fetch(tokens)

    def release(self, request_id: str) -> None:
        """The request finished, failed or was aborted: unpin what it was served. Default: nothing
        is pinned."""
        return None

    @property
    def bytes_used(self) -> int:
        """Bytes the back end holds in device memory. Default, for one that does not count them: 0."""
        return 0

    def set_byte_limit(self, max_bytes: int) -> int:
        """Hold at most ``max_bytes`` (within the back end's own limit), evicting to fit; returns
        the bytes evicted. Default, for a back end bounded otherwise (entries, blocks): 0."""
        return 0

    def list_entries(self) -> list[dict[str, Any]]:
        """One row per entry for the operator (key_hash, tokens, bytes, tier, hit_count,
        last_used, quantized). Default, for a back end that cannot list: none."""
        return []

    def evict(self, key: str) -> bool:
        """Drop one entry by ``key_hash``; False when unknown. Default: False (nothing to evict)."""
        return False

    def replace_turn(self, key: str) -> None:
        """A newer reply to the same prompt was stored: drop the entry stored under ``key`` (a
        ``key_hash``; see :mod:`engine_worker.cache.turns`). Default, for a back end that shares
        a prompt's blocks between its replies: nothing."""
        return None

    def save_to_disk(self, directory: str) -> bool:
        """Write every entry to ``directory`` (outside engine steps). Default: not saved (False)."""
        logger.info("the %s back end cannot be saved to disk", self.name)
        return False

    def load_from_disk(self, directory: str) -> int:
        """Load what :meth:`save_to_disk` wrote; returns the entries loaded. Default: 0."""
        logger.info("the %s back end cannot be loaded from disk", self.name)
        return 0

    def close(self) -> None:
        """Flush and stop the back end's disk tier, if it has one. Default: no disk tier."""
        return None


class NoPrefixCache(PrefixCacheBackend):
    """The back end used when prefix caching is off (or until a real one is plugged in)."""

    name = "prefix_cache"
    active = False

    def fetch(self, tokens: Sequence[int]) -> tuple[list[Any] | None, list[int], str]:
        return None, list(tokens), "miss"

    def store(self, tokens: Sequence[int], cache_layers: list[Any]) -> None:
        return None

    def get_stats(self) -> dict[str, Any]:
        return {"enabled": False}

    def clear(self) -> None:
        return None
