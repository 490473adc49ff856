"""The scheduler's prefix-cache steps around a request, beyond the fetch/store seam.

:class:`CacheLifecycle` is what the :class:`~engine_worker.sched.scheduler.Scheduler` calls, on the
engine thread; none of it does disk I/O:

* **mid-prefill saves** (``mid_prefill_save_interval``, :class:`MidPrefillSaver`): after each
  generator step, a long prompt still prefilling has its processed prefix stored every
  ``interval`` tokens (read with the runner's ``extract_cache``, which works in every stage; each
  save replaces the previous one, the store drops dominated prefixes). Only prompts longer than
  the interval are tracked, so a step costs nothing extra otherwise;
* **prompt-only snapshots** (``max_kv_size``, :func:`store_prompt_snapshot`): a request whose
  prompt is longer than the sliding window ends with a cache that cannot be trimmed (a
  ``RotatingKVCache`` that wrapped), so its prompt+output entry only serves the next turn of that
  exact conversation. Such a request (flagged at admission, by prompt length) has its cache
  captured once, when the prompt is processed, and stored under exactly the tokens it covers
  (seed S37): a later prompt extending the prompt with another follow-up hits it;
* **shared prefills** (:mod:`engine_worker.cache.shared_prefill`): a waiting prompt that shares a
  long prefix with a prompt still prefilling waits for it, and that prompt's cache is stored as
  soon as it is processed, so a prefix that many prompts bring at once is prefilled once;
* **aborts** (:func:`store_removed_prefix`): a request taken out of the batch leaves what it had
  already prefilled (and generated) in the cache, cut to the cache's offset, so a long prompt
  aborted halfway stays reusable;
* **SSD promotion** (:class:`SSDWaitPolicy`): a request whose lookup says ``ssd_pending`` waits in
  the queue, a bounded time, while the SSD tier reads its entry on its own thread; the engine step
  never blocks on it;
* **operator view**: list the entries, evict one by key.

Everything here is an optimisation: a failing back end is logged and counted in the seam's
errors, never fails a request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from engine_worker.cache import kv
from engine_worker.cache.protocol import PrefixCacheBackend
from engine_worker.cache.seam import PrefixSeam
from engine_worker.cache.shared_prefill import SharedPrefill
from engine_worker.common.request import Request

if TYPE_CHECKING:
    from engine_worker.runner.generator import BatchRunner

logger = logging.getLogger(__name__)

SSD_PENDING = "ssd_pending"

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
    if extracted is None:
        return None  # still queued, without a cache yet
    layers, tokens = extracted
    if not layers:
        return None
    n = len(prompt_tokens)
    covered = kv.cache_offset(layers)
    if covered < n:
        return None
    if kv.trimmable(layers):
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
        extract_cache: Callable[[list[int]], Mapping[int, tuple[list[Any], Sequence[int]]]],
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
            done = kv.cache_offset(extracted[0])
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

    def should_wait(self, request_id: str, hit_type: str | None) -> bool:
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


class CacheLifecycle:
    """Mid-prefill saves, abort stores, SSD waits and the operator view for one scheduler."""

    def __init__(self, seam: PrefixSeam, mid_prefill_save_interval: int, max_kv_size: int = 0) -> None:
        self._seam = seam
        self.backend = seam.backend
        self._saver: MidPrefillSaver | None = None
        self.ssd_wait: SSDWaitPolicy | None = None  # while a cache is active
        self._shared: SharedPrefill | None = None  # while a cache is active
        self._interval = 0
        # Prompts at least this long wrap the sliding window (0: no window, or a back end that
        # cannot store a wrapped window).
        self._window = max_kv_size if seam.active and self.backend.stores_wrapped_windows else 0
        if seam.active:
            self.ssd_wait = SSDWaitPolicy()
            self._shared = SharedPrefill()
            if mid_prefill_save_interval > 0:
                self._saver = MidPrefillSaver(self.backend, mid_prefill_save_interval)
                self._interval = mid_prefill_save_interval
        # Running requests whose prompt is long enough for a mid-prefill save and that have not
        # produced a token yet; usually empty, so the per-step check is one truthiness test.
        self._long_prefills: dict[str, Request] = {}
        # Running requests flagged for a prompt-only snapshot that has not been taken yet.
        self._prompt_snapshots: dict[str, Request] = {}

    # ---- admission ---------------------------------------------------------------------------

    def holds(self, request: Request) -> bool:
        """Before a lookup: True while the request follows a prefill in progress that covers
        more of its prompt than the cache would (it is looked up once that prompt is stored)."""
        return self._shared is not None and (self._shared.waits(request) or self._shared.follow(request))

    def defer(self, request: Request) -> bool:
        """After a lookup: True when the request should wait for its SSD entry (it is then
        looked up again at a later step). A request that stops waiting runs cold."""
        wait = self.ssd_wait
        if wait is None:
            return False
        hit_type = request.cache_hit_type
        if wait.should_wait(request.request_id, hit_type):
            request.remaining_tokens = None  # look it up again next step
            return True
        if hit_type == SSD_PENDING:  # the wait expired: it prefills cold
            request.cache_hit_type = "miss"
        return False

    def admitted(self, request: Request) -> None:
        """A request entered the batch: others may follow its prefill; track it for mid-prefill
        saves if its prompt is long, and for a prompt-only snapshot if it wraps the sliding window."""
        if self._shared is not None:
            self._shared.started(request)
        n = len(request.prompt_ids)
        if self._saver is not None and n > self._interval:
            self._long_prefills[request.request_id] = request
        if self._window and n >= self._window:
            self._prompt_snapshots[request.request_id] = request

    # ---- after a generator step --------------------------------------------------------------

    def after_step(self, runner: BatchRunner) -> None:
        """Store the processed prefix of long prompts still prefilling (every ``interval``), the
        prompt-only snapshots of flagged requests whose prompt is now processed, and the prompts
        that others follow."""
        if self._prompt_snapshots:
            self._snapshot_prompts(runner)
        if self._shared is not None and self._shared.leading:
            try:
                self._shared.after_step(self._leader_store(runner.extract_cache))
            except Exception:  # a failed store only loses a future hit; its followers go on
                logger.exception("shared prefill store failed")
                self._seam.errors += 1
                self._shared.release_all()
        saver = self._saver
        if saver is None or not self._long_prefills:
            return
        prefilling = []
        for rid, request in list(self._long_prefills.items()):
            if request.output_token_ids or request.batch_uid is None or request.is_finished():
                del self._long_prefills[rid]  # its prefill is over
                saver.forget(rid)
            else:
                prefilling.append((rid, request.batch_uid, request.prompt_ids))
        if not prefilling:
            return
        try:
            saver.after_step(prefilling, runner.extract_cache)
        except Exception:  # a failed save only loses a future hit
            logger.exception("mid-prefill save failed")
            self._seam.errors += 1

    def _leader_store(self, extract: Callable[[list[int]], dict[int, Any]]) -> Callable[[Request], bool | None]:
        """How a shared prefill's leader has its prompt stored once processed (whatever its
        cache's kind: its followers wait for it); None while it is still prefilling."""
        def store(request: Request) -> bool | None:
            uid = request.batch_uid
            if uid is None:
                return None  # not in the batch (the caller stops its leading)
            return store_prompt_snapshot(self.backend, request.prompt_ids, extract([uid]).get(uid),
                                         trimmable=True)
        return store

    def _snapshot_prompts(self, runner: BatchRunner) -> None:
        for rid, request in list(self._prompt_snapshots.items()):
            uid = request.batch_uid
            if request.output_token_ids or uid is None or request.is_finished():
                del self._prompt_snapshots[rid]  # too late: past its first token, or gone
                continue
            try:
                done = store_prompt_snapshot(self.backend, request.prompt_ids,
                                             runner.extract_cache([uid]).get(uid))
            except Exception:  # a failed snapshot only loses a future hit
                logger.exception("prompt-only snapshot failed for %s", rid)
                self._seam.errors += 1
                done = False
            if done is not None:
                del self._prompt_snapshots[rid]

    # ---- leaving the batch -------------------------------------------------------------------

    def store_removed(self, request: Request, removed: tuple[list[Any], Sequence[int]] | None) -> None:
        """Keep what a request taken out of the batch (abort) had prefilled and generated."""
        try:
            store_removed_prefix(self.backend, request.prompt_token_ids or [], request.output_token_ids,
                                 removed)
        except Exception:  # a failed store only loses a future hit
            logger.exception("prefix cache store failed for aborted %s", request.request_id)
            self._seam.errors += 1

    def forget(self, request_id: str) -> None:
        """The request finished, failed or was aborted (called once per request: cheap)."""
        # The saver only knows requests that were tracked as long prefills.
        if self._saver is not None and self._long_prefills.pop(request_id, None) is not None:
            self._saver.forget(request_id)
        if self._prompt_snapshots:
            self._prompt_snapshots.pop(request_id, None)
        if self.ssd_wait is not None:
            self.ssd_wait.forget(request_id)
        if self._shared is not None:
            self._shared.forget(request_id)

    # ---- operator view -----------------------------------------------------------------------

    def list_entries(self) -> list[dict[str, Any]]:
        """One row per cache entry (key_hash, tokens, bytes, tier, hit_count, last_used,
        quantized); empty when the back end cannot list."""
        return list(self.backend.list_entries()) if self.backend.active else []

    def evict(self, key: str) -> bool:
        """Drop one entry by key hash; False when unknown or the back end cannot evict."""
        return self.backend.evict(key) if self.backend.active else False
