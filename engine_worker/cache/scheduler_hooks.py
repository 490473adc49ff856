"""What the Scheduler calls around the prefix cache, beyond the fetch/store seam.

Each function is small and engine-thread safe (no disk I/O):

* :func:`default_prefix_cache` builds the back end the config asks for (the seed builds it inside
  ``Scheduler.__init__``), or :class:`NoPrefixCache`.
* :func:`store_removed_prefix` keeps what an aborted (or stop-string-removed) request had already
  prefilled: ``BatchGenerator.remove(uids, return_prompt_caches=True)`` returns the cache even in
  the middle of a prefill, with ``offset`` = tokens processed so far, and the memory-aware store
  cuts the key to that offset. So a long prompt aborted halfway leaves its prefix reusable.
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
* :func:`prefill_segments` cuts a prompt at multiples of ``mid_prefill_save_interval``, for a
  scheduler that prefers ``insert_segments`` + ``end_of_segment`` to polling.
* :class:`SSDWaitPolicy` lets a request whose lookup said ``ssd_pending`` wait a bounded number
  of steps for the background read, instead of prefilling cold.
* :func:`close_prefix_cache` flushes the SSD tier's writer on shutdown.

Wiring into ``Scheduler`` (about 20 lines; the tests for it are ready in the cache test package):

1. ``__init__``: ``self._mid_prefill = MidPrefillSaver(self.prefix_cache,
   config.mid_prefill_save_interval)`` and ``self.ssd_wait = SSDWaitPolicy()``.
2. ``MlxBatchRunner.extract_cache(uids)``: ``return self.generator.extract_cache(uids)``.
3. ``step()``, right after ``responses = self.runner.step()``:
   ``self._mid_prefill.after_step(((r.request_id, r.batch_uid, r.prompt_token_ids) for r in
   self.running.values() if not r.output_token_ids), self.runner.extract_cache)``.
4. ``abort_request`` of a running request: ``removed = self.runner.remove([uid],
   return_caches=True)``, then ``store_removed_prefix(self.prefix_cache,
   request.prompt_token_ids, request.output_token_ids, removed.get(uid))``; ``forget(rid)`` on
   the saver at abort, finish and failure.
5. Admission: keep ``"ssd_pending"`` as the request's ``cache_hit_type``; in
   ``_schedule_waiting``, a request for which ``self.ssd_wait.should_wait(rid, hit_type)`` is
   popped into a deferred list with ``remaining_tokens = None`` (looked up again next step) and
   pushed back after the loop, so it never blocks the queue.
6. Operator view: ``list_cache_entries()`` / ``evict_cache_entry(key)`` delegate to the back
   end's ``list_entries()`` / ``evict(key)``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from engine_worker.cache.factory import build_prefix_cache
from engine_worker.cache_protocol import NoPrefixCache, PrefixCacheBackend

logger = logging.getLogger(__name__)


def default_prefix_cache(model: Any, config: Any) -> PrefixCacheBackend:
    """The configured back end, or :class:`NoPrefixCache` when ``enable_prefix_cache`` is off."""
    cache = build_prefix_cache(model, config)
    return cache if cache is not None else NoPrefixCache()


def store_removed_prefix(
    backend: PrefixCacheBackend,
    prompt_tokens: Sequence[int],
    output_tokens: Sequence[int],
    removed: tuple[list[Any], Sequence[int]] | None,
) -> bool:
    """Store the cache of a request taken out of the batch (abort, stop string, segment end).

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
) -> bool | None:
    """Store a request's cache under its prompt once the prompt is processed, if it cannot be
    trimmed (otherwise the prompt+output entry stored on finish already serves every prefix).

    ``extracted`` is ``extract_cache([uid])[uid]``: ``(cache_layers, tokens)`` with ``tokens``
    the tokens the cache holds. Returns None while the prompt is still prefilling (ask again
    after the next step), True when an entry was offered, False when there is nothing to store
    (trimmable cache, or a coverage that is neither the prompt nor the prompt + one token).
    """
    from mlx_lm.models.cache import can_trim_prompt_cache

    if extracted is None or not extracted[0]:
        return None  # still queued, without a cache yet
    layers, tokens = extracted
    n = len(prompt_tokens)
    covered = int(getattr(layers[0], "offset", 0))
    if covered < n:
        return None
    if can_trim_prompt_cache(layers):
        return False
    if covered == n:
        key = list(prompt_tokens)
    elif covered == n + 1 and len(tokens) == n + 1:  # the first generated token is already fed
        key = [*prompt_tokens, int(tokens[n])]
    else:
        return False
    backend.store(key, layers)
    return True


def prefill_segments(tokens: Sequence[int], cached_tokens: int, interval: int) -> list[list[int]]:
    """Split the tokens still to prefill so that segment ends fall on multiples of ``interval``
    counted from the prompt start (``cached_tokens`` are already covered). ``interval <= 0`` or a
    short prompt gives one segment. The last segment is never empty."""
    tokens = list(tokens)
    if interval <= 0 or len(tokens) <= 1:
        return [tokens]
    segments: list[list[int]] = []
    start = 0
    boundary = (cached_tokens // interval + 1) * interval - cached_tokens
    # Keep at least one token in the last segment: it is what produces the first new token.
    while boundary < len(tokens):
        segments.append(tokens[start:boundary])
        start = boundary
        boundary += interval
    segments.append(tokens[start:])
    return segments


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


def close_prefix_cache(backend: PrefixCacheBackend) -> None:
    """Flush and stop the SSD tier's I/O thread, if the back end has one (shutdown only)."""
    tier = getattr(backend, "ssd_tier", None)
    if tier is not None:
        tier.close()
