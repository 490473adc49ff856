"""The scheduler's prefix-cache lifecycle around a request, beyond the fetch/store seam.

Wires :mod:`engine_worker.cache.scheduler_hooks` into the :class:`~engine_worker.scheduler.Scheduler`:

* **mid-prefill saves** (``mid_prefill_save_interval``): after each generator step, a long prompt
  that is still prefilling has its processed prefix stored every ``interval`` tokens. Only
  prompts longer than the interval are tracked, so a step costs nothing extra otherwise;
* **prompt-only snapshots** (``max_kv_size``): a request whose prompt is longer than the sliding
  window ends with a cache that cannot be trimmed, so its prompt+output entry only serves the
  next turn of that exact conversation. Such a request (flagged at admission, by prompt length)
  has its cache captured once, when the prompt is processed, and stored under the prompt
  (seed S37): a later prompt extending the prompt with another follow-up hits it. Other requests
  cost nothing extra per step;
* **shared prefills** (:mod:`engine_worker.cache.shared_prefill`): a waiting prompt that shares a
  long prefix with a prompt still prefilling waits for it, and that prompt's cache is stored as
  soon as it is processed, so a prefix that many prompts bring at once is prefilled once;
* **aborts**: a running request taken out of the batch leaves what it had already prefilled
  (and generated) in the cache;
* **SSD promotion**: a request whose lookup says ``ssd_pending`` waits in the queue, a bounded
  time, while the SSD tier reads its entry on its own thread; the engine step never blocks on it;
* **operator view**: list the entries, evict one by key.

Everything here is an optimisation: a failing back end is logged and counted in the seam's
errors, never fails a request. Runs on the engine thread only. The cache package is imported
only when a real back end is active (it loads the cache tiers).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from engine_worker.cache.seam import PrefixSeam
from engine_worker.common.request import Request

logger = logging.getLogger(__name__)

SSD_PENDING = "ssd_pending"


class CacheLifecycle:
    """Mid-prefill saves, abort stores, SSD waits and the operator view for one scheduler."""

    def __init__(self, seam: PrefixSeam, mid_prefill_save_interval: int, max_kv_size: int = 0) -> None:
        self._seam = seam
        self.backend = seam.backend
        self._saver: Any = None
        self.ssd_wait: Any = None  # SSDWaitPolicy while a cache is active
        self._shared: Any = None  # SharedPrefill while a cache is active
        self._interval = 0
        # Prompts at least this long wrap the sliding window (0: no window, or a back end that
        # cannot store a wrapped window).
        self._window = max_kv_size if seam.active and getattr(self.backend, "stores_wrapped_windows", False) else 0
        if seam.active:
            from engine_worker.cache.scheduler_hooks import MidPrefillSaver, SSDWaitPolicy
            from engine_worker.cache.shared_prefill import SharedPrefill

            self.ssd_wait = SSDWaitPolicy()
            self._shared = SharedPrefill(self.backend)
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
        n = len(request.prompt_token_ids)
        if self._saver is not None and n > self._interval:
            self._long_prefills[request.request_id] = request
        if self._window and n >= self._window:
            self._prompt_snapshots[request.request_id] = request

    # ---- after a generator step --------------------------------------------------------------

    def after_step(self, runner: Any) -> None:
        """Store the processed prefix of long prompts still prefilling (every ``interval``), the
        prompt-only snapshots of flagged requests whose prompt is now processed, and the prompts
        that others follow."""
        if self._prompt_snapshots:
            self._snapshot_prompts(runner)
        if self._shared is not None and self._shared.leading:
            try:
                self._shared.after_step(getattr(runner, "extract_cache", None))
            except Exception:  # a failed store only loses a future hit; its followers go on
                logger.exception("shared prefill store failed")
                self._seam.errors += 1
                self._shared.release_all()
        if not self._long_prefills:
            return
        prefilling = []
        for rid, request in list(self._long_prefills.items()):
            if request.output_token_ids or request.batch_uid is None or request.is_finished():
                del self._long_prefills[rid]  # its prefill is over
                self._saver.forget(rid)
            else:
                prefilling.append((rid, request.batch_uid, request.prompt_token_ids))
        extract = getattr(runner, "extract_cache", None)
        if not prefilling or extract is None:
            return
        try:
            self._saver.after_step(prefilling, extract)
        except Exception:  # a failed save only loses a future hit
            logger.exception("mid-prefill save failed")
            self._seam.errors += 1

    def _snapshot_prompts(self, runner: Any) -> None:
        from engine_worker.cache.scheduler_hooks import store_prompt_snapshot

        extract = getattr(runner, "extract_cache", None)
        for rid, request in list(self._prompt_snapshots.items()):
            uid = request.batch_uid
            if extract is None or request.output_token_ids or uid is None or request.is_finished():
                del self._prompt_snapshots[rid]  # too late: past its first token, or gone
                continue
            try:
                done = store_prompt_snapshot(self.backend, request.prompt_token_ids,
                                             extract([uid]).get(uid))
            except Exception:  # a failed snapshot only loses a future hit
                logger.exception("prompt-only snapshot failed for %s", rid)
                self._seam.errors += 1
                done = False
            if done is not None:
                del self._prompt_snapshots[rid]

    # ---- leaving the batch -------------------------------------------------------------------

    def store_removed(self, request: Request, removed: tuple[list[Any], Sequence[int]] | None) -> None:
        """Keep what a request taken out of the batch (abort) had prefilled and generated."""
        from engine_worker.cache.scheduler_hooks import store_removed_prefix

        try:
            store_removed_prefix(self.backend, request.prompt_token_ids or [], request.output_token_ids,
                                 removed)
        except Exception:  # a failed store only loses a future hit
            logger.exception("prefix cache store failed for aborted %s", request.request_id)
            self._seam.errors += 1

    def forget(self, request_id: str) -> None:
        """The request finished, failed or was aborted (called once per request: cheap)."""
        # The saver only knows requests that were tracked as long prefills.
        if self._long_prefills and self._long_prefills.pop(request_id, None) is not None:
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
        list_entries = getattr(self.backend, "list_entries", None)
        return list(list_entries()) if list_entries is not None and self.backend.active else []

    def evict(self, key: str) -> bool:
        """Drop one entry by key hash; False when unknown or the back end cannot evict."""
        evict = getattr(self.backend, "evict", None)
        return bool(evict(key)) if evict is not None and self.backend.active else False
