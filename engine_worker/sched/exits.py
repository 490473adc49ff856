"""How a request leaves the scheduler's batch: it finishes, fails or is aborted.

A mixin of :class:`engine_worker.sched.scheduler.Scheduler`, kept apart so the step function's file stays
readable; it works on the scheduler's own state, named below. Every way out releases the same
things, once: the request's generator uid and bookkeeping, its text stream, the prefix-cache pins
it was served from (after its own cache is stored), and its cache-lifecycle tracking.
"""

from __future__ import annotations

import logging
from typing import Any

from engine_worker.cache.hooks import CacheLifecycle
from engine_worker.cache.seam import PrefixSeam
from engine_worker.common.request import Request, RequestOutput, RequestStatus, step_output
from engine_worker.runner.generator import BatchRunner
from engine_worker.runner.text_stream import TextStream
from engine_worker.sched.stats import SchedulerCounters
from engine_worker.sched.waiting_queue import WaitingQueue

logger = logging.getLogger(__name__)

_FINISH_STATUS = {"stop": RequestStatus.FINISHED_STOPPED, "length": RequestStatus.FINISHED_LENGTH_CAPPED}


class BatchExits:
    """Finishing, failing and aborting requests, and dropping a failed generator."""

    requests: dict[str, Request]
    running: dict[str, Request]
    waiting: WaitingQueue
    counters: SchedulerCounters
    runner: BatchRunner | None
    request_id_to_uid: dict[str, int]
    uid_to_request_id: dict[int, str]
    _cache: PrefixSeam
    _lifecycle: CacheLifecycle
    _streams: dict[str, TextStream]
    _live_by_uid: dict[int, tuple[Request, TextStream]]
    _logprobs_by_uid: dict[int, int]
    _prefilling: set[int]
    _first_tokens_due: int
    _pending_outputs: list[RequestOutput]
    _processor_errors: dict[str, BaseException]

    def _processor_guard(self, request: Request) -> Any:
        if not request.sampling_params.logits_processors:
            return None
        errors, rid = self._processor_errors, request.request_id
        return lambda exc: errors.setdefault(rid, exc)

    def _fail_processor_errors(self) -> None:
        errors, self._processor_errors = self._processor_errors, {}
        for rid, exc in errors.items():
            request = self.running.get(rid)
            if request is not None:
                self._remove_from_batch(request)
                self._fail(request, f"logits processor failed: {exc!r}")

    def _remove_from_batch(self, request: Request, *, stop_string: bool = False) -> None:
        uid = self.request_id_to_uid.get(request.request_id)
        if uid is None or self.runner is None:
            return
        want = stop_string and self._cache.active
        removed = self.runner.remove([uid], return_caches=want)
        if want and uid in removed:
            cache, tokens = removed[uid]
            request.prompt_cache = (cache, list(tokens))

    def _finish(self, request: Request, reason: str, cache: Any = None, all_tokens: Any = None) -> None:
        rid = request.request_id
        request.set_finished(_FINISH_STATUS[reason], reason)
        if cache is None and isinstance(request.prompt_cache, tuple):
            cache, all_tokens = request.prompt_cache
        request.prompt_cache = None
        if cache is not None and all_tokens is not None and self._cache.active:
            self._cache.store(rid, all_tokens, cache)
        self._release(rid)  # after the store: the blocks it was served from stay pinned till then
        self.counters.num_requests_processed += 1
        self.counters.total_completion_tokens += request.num_output_tokens

    def _release(self, rid: str) -> None:
        self._unmap(rid)
        self._streams.pop(rid, None)

    def _unmap(self, rid: str) -> None:
        """Take a request out of the batch's bookkeeping (not out of the generator)."""
        self.running.pop(rid, None)
        self._lifecycle.forget(rid)
        self._cache.release(rid)
        uid = self.request_id_to_uid.pop(rid, None)
        if uid is not None:
            self.uid_to_request_id.pop(uid, None)
            self._live_by_uid.pop(uid, None)
            self._logprobs_by_uid.pop(uid, None)
            self._prefilling.discard(uid)

    def _final_output(self, request: Request) -> RequestOutput:
        """The output of a request that ended outside a generator step (error, abort)."""
        out = step_output(request, [], "", request.finish_reason)
        out.finished = True
        out.error = request.error
        return out

    def _fail(self, request: Request, message: str) -> None:
        """Finish one request with an error; its output goes out with the next step."""
        request.error = message
        request.set_finished(RequestStatus.FINISHED_ERROR, "error")
        request.prompt_cache = None
        self._release(request.request_id)
        self.counters.num_requests_failed += 1
        self._pending_outputs.append(self._final_output(request))

    def _fail_running(self, message: str) -> None:
        for request in list(self.running.values()):
            self._fail(request, message)
        self._drop_runner()

    def _drop_runner(self) -> None:
        """Discard a generator whose state is unknown after a failed step."""
        self._prefilling.clear()
        self._first_tokens_due = 0
        runner, self.runner = self.runner, None
        if runner is not None:
            try:
                runner.close()
            except Exception:  # best effort: the generator is being discarded anyway
                logger.exception("closing a failed generator raised")

    def abort_request(self, request_id: str) -> bool:
        """Abort now: a waiting request is dropped and never runs; a running one leaves the batch
        before the next step. Its final output (``finish_reason="abort"``) goes out with the next
        step. Returns False if the request is unknown or already finished."""
        request = self.requests.get(request_id)
        if request is None or request.is_finished():
            return False
        if request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
            self.waiting.remove(request)
            self.counters.total_completion_tokens += request.num_output_tokens  # a preempted one has some
        else:
            self._abort_in_batch(request)
            self.counters.total_completion_tokens += request.num_output_tokens
        request.set_finished(RequestStatus.FINISHED_ABORTED, "abort")
        request.prompt_cache = None
        self._release(request_id)
        self.counters.num_requests_aborted += 1
        self._pending_outputs.append(self._final_output(request))
        return True

    def _abort_in_batch(self, request: Request) -> None:
        """Take a running request out of the batch, keeping what it had prefilled (and
        generated) in the prefix cache: a long prompt aborted halfway stays reusable."""
        uid = self.request_id_to_uid.get(request.request_id)
        if uid is None or self.runner is None:
            return
        active = self._cache.active
        removed = self.runner.remove([uid], return_caches=active)
        if active:
            self._lifecycle.store_removed(request, removed.get(uid))
