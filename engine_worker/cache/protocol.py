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
per-layer cache; it must not block on I/O (it runs inside an engine step).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class PrefixCacheBackend(Protocol):
    """What the scheduler needs from a prefix cache."""

    #: Key of this back end's stats in ``Scheduler.get_stats()`` (seed: ``memory_aware_cache``,
    #: ``paged_cache`` or ``prefix_cache``).
    name: str
    #: False for a back end that never stores (the scheduler then skips extracting caches).
    active: bool

    def fetch(self, tokens: Sequence[int]) -> tuple[list[Any] | None, list[int], str]: ...

    def store(self, tokens: Sequence[int], cache_layers: list[Any]) -> None: ...

    def get_stats(self) -> dict[str, Any]: ...

    def clear(self) -> None: ...


class NoPrefixCache:
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
