"""How a request leaves the scheduler: it finishes, fails or is aborted.

Every way out releases the same things, once: the request's place in the batch (its generator uid
and bookkeeping), its text stream, the prefix-cache pins it was served from (after its own cache
is stored) and its cache-lifecycle tracking. A request that ends outside a generator step (an
error, an abort) has its final output kept in an outbox, which the next step hands out.

The caches of the requests that finish in a step are stored together, once the step's responses
are handled (:meth:`Exits.store_finished`): one device sync for all their copies, not one per
request (a step of one-token requests finishes a whole prefill batch).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from engine_worker.cache.hooks import CacheLifecycle
from engine_worker.cache.seam import PrefixSeam
from engine_worker.common.request import Request, RequestOutput, RequestStatus, step_output
from engine_worker.sched.batch import Batch
from engine_worker.sched.stats import SchedulerCounters
from engine_worker.sched.waiting_queue import WaitingQueue

logger = logging.getLogger(__name__)

_FINISH_STATUS = {"stop": RequestStatus.FINISHED_STOPPED, "length": RequestStatus.FINISHED_LENGTH_CAPPED}


class Exits:
    """Finishing, failing and aborting the requests of one scheduler."""

    def __init__(self, requests: dict[str, Request], waiting: WaitingQueue, batch: Batch, cache: PrefixSeam,
                 lifecycle: CacheLifecycle, counters: SchedulerCounters) -> None:
        self._requests = requests
        self._waiting = waiting
        self._batch = batch
        self._cache = cache
        self._lifecycle = lifecycle
        self._counters = counters
        self._outbox: list[RequestOutput] = []
        # Requests finished in this step whose cache waits for store_finished (they stay pinned).
        self._to_store: list[tuple[Request, Any, list[Any]]] = []
        self._processor_errors: dict[str, BaseException] = {}  # filled during a generator step

    # ---- the outbox --------------------------------------------------------------------------

    @property
    def pending(self) -> bool:
        """Whether final outputs wait for the next step."""
        return bool(self._outbox)

    def take(self) -> list[RequestOutput]:
        """The final outputs of requests that ended since the last call."""
        outputs, self._outbox = self._outbox, []
        return outputs

    # ---- leaving -----------------------------------------------------------------------------

    def unmap(self, request_id: str, *, unpin: bool = True) -> None:
        """Take a request out of the batch's books (not out of the generator) and give back what
        the cache holds for it (with ``unpin``); its text stream stays (a preempted request goes
        on with it)."""
        self._batch.leave(request_id)
        self._lifecycle.forget(request_id)
        if unpin:
            self._cache.release(request_id)

    def _release(self, request_id: str, *, unpin: bool = True) -> None:
        self.unmap(request_id, unpin=unpin)
        self._batch.streams.pop(request_id, None)

    def remove_from_batch(self, request: Request, *, stop_string: bool = False) -> None:
        """Take a running request's sequence out of the generator. One ended by a stop string
        keeps its cache, to be stored when it finishes (an active prefix cache only)."""
        want = stop_string and self._cache.active
        uid = self._batch.request_id_to_uid.get(request.request_id)
        removed = self._batch.remove([request], return_caches=want)
        if want and uid in removed:
            cache, tokens = removed[uid]
            request.prompt_cache = (cache, list(tokens))

    def finish(self, request: Request, reason: str, cache: Any = None, all_tokens: Any = None) -> None:
        """A request ended with ``stop`` or ``length``: its cache is offered to the prefix cache by
        the next :meth:`store_finished` (call it once the step's responses are handled)."""
        rid = request.request_id
        request.set_finished(_FINISH_STATUS[reason], reason)
        if cache is None and isinstance(request.prompt_cache, tuple):
            cache, all_tokens = request.prompt_cache
        request.prompt_cache = None
        store = cache is not None and all_tokens is not None and self._cache.active
        if store:
            self._to_store.append((request, all_tokens, cache))
        # The blocks it was served from stay pinned until its own cache is stored.
        self._release(rid, unpin=not store)
        self._counters.num_requests_processed += 1
        self._counters.total_completion_tokens += request.num_output_tokens

    def store_finished(self) -> None:
        """Store the caches of the requests finished since the last call, all at once (one
        evaluation of their copies), then unpin what those requests were served from."""
        if not self._to_store:
            return
        finished, self._to_store = self._to_store, []
        self._cache.store_finished(finished)
        for request, _tokens, _cache in finished:
            self._cache.release(request.request_id)

    def fail(self, request: Request, message: str) -> None:
        """Finish one request with an error; its output goes out with the next step."""
        request.error = message
        request.set_finished(RequestStatus.FINISHED_ERROR, "error")
        request.prompt_cache = None
        self._release(request.request_id)
        self._counters.num_requests_failed += 1
        self._outbox.append(_final_output(request))

    def fail_running(self, message: str) -> None:
        """Fail every running request and drop the generator (its state is unknown)."""
        for request in list(self._batch.running.values()):
            self.fail(request, message)
        self._batch.drop_runner()

    def abort(self, request_id: str) -> bool:
        """Abort now: a waiting request is dropped and never runs; a running one leaves the batch
        before the next step. Its final output (``finish_reason="abort"``) goes out with the next
        step. Returns False if the request is unknown or already finished."""
        request = self._requests.get(request_id)
        if request is None or request.is_finished():
            return False
        if request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
            self._waiting.remove(request)
        else:
            self._abort_in_batch(request)
        self._counters.total_completion_tokens += request.num_output_tokens  # a preempted one has some
        request.set_finished(RequestStatus.FINISHED_ABORTED, "abort")
        request.prompt_cache = None
        self._release(request_id)
        self._counters.num_requests_aborted += 1
        self._outbox.append(_final_output(request))
        return True

    def _abort_in_batch(self, request: Request) -> None:
        """Take a running request out of the batch, keeping what it had prefilled (and
        generated) in the prefix cache: a long prompt aborted halfway stays reusable."""
        uid = self._batch.request_id_to_uid.get(request.request_id)
        if uid is None or self._batch.runner is None:
            return
        active = self._cache.active
        removed = self._batch.remove([request], return_caches=active)
        if active:
            self._lifecycle.store_removed(request, removed.get(uid))

    # ---- logits processors -------------------------------------------------------------------

    def processor_guard(self, request: Request) -> Callable[[BaseException], Any] | None:
        """What a request's logits processors report a failure to (during a generator step);
        None for a request without processors."""
        if not request.sampling_params.logits_processors:
            return None
        errors, rid = self._processor_errors, request.request_id
        return lambda exc: errors.setdefault(rid, exc)

    def fail_processor_errors(self) -> None:
        """After a step: a request whose logits processor raised fails alone."""
        if not self._processor_errors:
            return
        errors, self._processor_errors = self._processor_errors, {}
        for rid, exc in errors.items():
            request = self._batch.running.get(rid)
            if request is not None:
                self.remove_from_batch(request)
                self.fail(request, f"logits processor failed: {exc!r}")


def _final_output(request: Request) -> RequestOutput:
    """The output of a request that ended outside a generator step (error, abort)."""
    out = step_output(request, [], "", request.finish_reason)
    out.finished = True
    out.error = request.error
    return out
