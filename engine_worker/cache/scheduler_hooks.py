"""The prefix-cache steps the scheduler takes around a request, beyond the fetch/store seam.

:class:`engine_worker.cache.hooks.CacheLifecycle` calls them on the engine thread; none does
disk I/O:

* :func:`store_removed_prefix` keeps what an aborted request had already prefilled:
  ``BatchGenerator.remove(uids, return_prompt_caches=True)`` returns the cache even in the
  middle of a prefill, with ``offset`` = tokens processed so far, and the store cuts the key to
  that offset. So a long prompt aborted halfway leaves its prefix reusable.
* :class:`MidPrefillSaver` implements ``mid_prefill_save_interval``: after a step, for each
  request still prefilling, it reads ``BatchGenerator.extract_cache([uid])`` (public; works in
  every stage) and stores the processed prefix each time it grew by ``interval`` tokens. Each
  save replaces the previous one (the store drops dominated prefixes).
* :func:`store_prompt_snapshot` is the seed's prompt-only entry for caches that cannot be trimmed
  (a ``RotatingKVCache`` whose window wrapped, under ``max_kv_size``): the prompt+output entry
  stored on finish only serves prompts that extend the *whole* conversation, so the cache is
  also captured once the prompt is processed (``extract_cache``) and stored under exactly the
  tokens it covers (the prompt, or the prompt + first generated token). A later prompt that
  extends the prompt with a different follow-up then hits it.
* :class:`SSDWaitPolicy` lets a request whose lookup said ``ssd_pending`` wait a bounded time
  for the background read, rather than prefill cold.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import engine_worker.runner.mlx_core  # noqa: F401  (OpenBLAS before mlx-lm loads mlx)

from mlx_lm.models.cache import can_trim_prompt_cache

from engine_worker.cache.protocol import PrefixCacheBackend

logger = logging.getLogger(__name__)


def store_removed_prefix(
    backend: PrefixCacheBackend,
    prompt_tokens: Sequence[int],
    output_tokens: Sequence[int],
    removed: tuple[list[Any], Sequence[int]] | None,
) -> bool:
    """Store the cache of a request taken out of the batch (an abort).

    ``removed`` is the ``(cache_layers, tokens)`` pair from ``remove(..., return_prompt_caches=True)``
    or ``extract_cache``. The entry's key is the prompt + output cut to the cache's offset, so
    a half-prefilled prompt stores exactly its processed prefix. Returns whether anything was
    offered to the back end.
    """
    if removed is None or not backend.active:
        return False
    cache_layers, _tokens = removed
    if not cache_layers:
        return False
    backend.store(list(prompt_tokens) + list(output_tokens), cache_layers)
    return True


def store_prompt_snapshot(
    backend: PrefixCacheBackend,
    prompt_tokens: Sequence[int],
    extracted: tuple[list[Any] | None, Sequence[int]] | None,
    *,
    trimmable: bool = False,
) -> bool | None:
    """Store a request's cache under its prompt once the prompt is processed, if it cannot be
    trimmed (otherwise the prompt+output entry stored on finish already serves every prefix), or
    with ``trimmable`` whatever the cache (others wait for this prompt: the finish is too late).

    ``extracted`` is ``extract_cache([uid])[uid]``: ``(cache_layers, tokens)`` with ``tokens``
    the tokens the cache holds. Returns None while the prompt is still prefilling (ask again
    after the next step), True when an entry was offered, False when there is nothing to store
    (trimmable cache, or a coverage that is neither the prompt nor the prompt + one token).
    """
    if extracted is None or not extracted[0]:
        return None  # still queued, without a cache yet
    layers, tokens = extracted
    n = len(prompt_tokens)
    covered = int(getattr(layers[0], "offset", 0))
    if covered < n:
        return None
    if can_trim_prompt_cache(layers):
        if not trimmable:
            return False
        backend.store(list(prompt_tokens), layers)  # cut to the prompt
        return True
    if covered == n:
        key = list(prompt_tokens)
    elif covered == n + 1 and len(tokens) == n + 1:  # the first generated token is already fed
        key = [*prompt_tokens, int(tokens[n])]
    else:
        return False
    backend.store(key, layers)
    return True


class MidPrefillSaver:
    """Store a long prompt's processed prefix every ``interval`` tokens while it prefills.

    Call :meth:`after_step` once per scheduler step with the requests that have produced no
    token yet. Only prompts longer than ``interval`` are polled, so with the default 8192 the
    cost is nil for ordinary prompts. Runs on the engine thread; the store does no disk I/O.
    """

    def __init__(self, backend: PrefixCacheBackend, interval: int) -> None:
        self.backend = backend
        self.interval = interval
        self._saved: dict[str, int] = {}  # request id -> tokens covered by its last save

    @property
    def enabled(self) -> bool:
        return self.interval > 0 and self.backend.active

    def after_step(
        self,
        prefilling: Iterable[tuple[str, int, Sequence[int]]],
        extract_cache: Callable[[list[int]], dict[int, tuple[list[Any], Sequence[int]]]],
    ) -> int:
        """``prefilling`` yields ``(request_id, generator_uid, prompt_tokens)``; returns the
        number of saves made."""
        if not self.enabled:
            return 0
        saves = 0
        for rid, uid, prompt in prefilling:
            if len(prompt) <= self.interval:
                continue
            extracted = extract_cache([uid]).get(uid)
            if extracted is None or not extracted[0]:
                continue
            done = int(getattr(extracted[0][0], "offset", 0))
            if done - self._saved.get(rid, 0) >= self.interval and done < len(prompt):
                self.backend.store(list(prompt[:done]), extracted[0])
                self._saved[rid] = done
                saves += 1
        return saves

    def forget(self, request_id: str) -> None:
        """Drop the bookkeeping of a request that finished, failed or was aborted."""
        self._saved.pop(request_id, None)


class SSDWaitPolicy:
    """Hold a request at most ``max_wait_s`` while its SSD entry is read in the background.

    The scheduler re-runs its lookup for a held request at the next step; the request is admitted
    as soon as the lookup stops saying ``ssd_pending`` (the entry was promoted, or the read
    failed) or the wait expires (then it prefills cold). Nothing blocks: other requests keep
    being admitted and decoded meanwhile.
    """

    def __init__(self, max_wait_s: float = 0.5) -> None:
        self.max_wait_s = max_wait_s
        self._since: dict[str, float] = {}

    def should_wait(self, request_id: str, hit_type: str) -> bool:
        if hit_type != "ssd_pending":
            self._since.pop(request_id, None)
            return False
        first = self._since.setdefault(request_id, time.monotonic())
        if time.monotonic() - first < self.max_wait_s:
            return True
        logger.info("request %s: SSD promotion slower than %.2fs, prefilling cold", request_id,
                    self.max_wait_s)
        self._since.pop(request_id, None)
        return False

    def forget(self, request_id: str) -> None:
        self._since.pop(request_id, None)

