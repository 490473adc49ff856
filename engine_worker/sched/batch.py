"""The batch: the requests the generator runs, and the generator itself.

:class:`Batch` keeps the books that every way into and out of the batch must keep in step: the
running set, request id <-> generator uid, uid -> (request, text stream) for the per-token hot
path, the uids of requests that ask for log probabilities, and the uids still prefilling (they
hold the generator's prefill slots). The scheduler decides who joins and who leaves; the batch
records it and drives the runner. Runs on the engine thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from engine_worker.common.request import Request
from engine_worker.runner.generator import BatchRunner
from engine_worker.runner.text_stream import TextStream
from engine_worker.sched.memory import BatchPlan, MemoryGuard

logger = logging.getLogger(__name__)


def sequence_tokens(request: Request) -> int:
    """The tokens a request's KV holds once its prompt is processed: a resumed request's output
    so far is part of its prompt."""
    return request.num_prompt_tokens + request.num_output_tokens


class Batch:
    """The running requests, their generator uids and text streams, and the runner that steps them.

    The runner is made at the first insert, by ``new_runner``, on the thread that will step it.
    """

    def __init__(self, new_runner: Callable[[], BatchRunner]) -> None:
        self._new_runner = new_runner
        self.runner: BatchRunner | None = None
        self.running: dict[str, Request] = {}
        self.request_id_to_uid: dict[str, int] = {}
        self.uid_to_request_id: dict[int, str] = {}
        self.live: dict[int, tuple[Request, TextStream]] = {}  # the hot path's one lookup
        self.logprobs: dict[int, int] = {}  # uids whose requests ask for log probabilities: k
        # A request's text stream lives from its first admission to its end: a preempted request
        # waits with it and its text goes on when it runs again.
        self.streams: dict[str, TextStream] = {}
        # Uids inserted whose prompt has not ended yet: they hold the generator's prefill slots
        # (``prefill_batch_size``). And how many prompts the last step ended: the next step returns
        # their first tokens.
        self.prefilling: set[int] = set()
        self.first_tokens_due = 0

    # ---- joining and leaving -----------------------------------------------------------------

    def ensure_runner(self) -> BatchRunner:
        """The runner, made now if there is none (call it on the thread that will step it)."""
        if self.runner is None:
            self.runner = self._new_runner()
        return self.runner

    def insert(self, tokens: list[int], *, urgent: bool, **kwargs: Any) -> int:
        """Hand a sequence to the runner (its urgent lane with ``urgent``); returns its uid. The
        runner validates before it changes anything, so a ``ValueError``/``TypeError`` leaves the
        batch as it was."""
        runner = self.ensure_runner()
        insert = runner.insert_urgent if urgent else runner.insert
        return insert(tokens, **kwargs)

    def join(self, request: Request, uid: int, stream: TextStream) -> None:
        """Record a request the runner took as ``uid``; it prefills first."""
        rid = request.request_id
        request.batch_uid = uid
        self.prefilling.add(uid)
        self.request_id_to_uid[rid] = uid
        self.uid_to_request_id[uid] = rid
        self.running[rid] = request
        self.streams[rid] = stream
        self.live[uid] = (request, stream)
        k = request.sampling_params.logprobs
        if k is not None:
            self.logprobs[uid] = k

    def leave(self, request_id: str) -> None:
        """Take a request out of the books (not out of the runner: see :meth:`remove`). Its text
        stream stays, for a preempted request that runs again."""
        self.running.pop(request_id, None)
        uid = self.request_id_to_uid.pop(request_id, None)
        if uid is not None:
            self.uid_to_request_id.pop(uid, None)
            self.live.pop(uid, None)
            self.logprobs.pop(uid, None)
            self.prefilling.discard(uid)

    def remove(self, requests: Iterable[Request], return_caches: bool = False) -> dict[int, tuple[list[Any], list[int]]]:
        """Take requests' sequences out of the runner, in one removal (each copies the batch's KV);
        with ``return_caches``, ``{uid: (cache_layers, tokens)}``."""
        uids = [self.request_id_to_uid[r.request_id] for r in requests if r.request_id in self.request_id_to_uid]
        if not uids or self.runner is None:
            return {}
        return self.runner.remove(uids, return_caches=return_caches)

    # ---- stepping ----------------------------------------------------------------------------

    def step(self) -> Sequence[Any]:
        """One runner step; returns its generated responses. The prompts it ended stop holding
        prefill slots, and their first tokens are due from the next step."""
        result = self.ensure_runner().step()
        self.first_tokens_due = len(result.prompts_done)
        self.prefilling.difference_update(result.prompts_done)
        return result.generated

    def decoding(self) -> list[Request]:
        """Running requests past their prompt (a prefilling one holds a slot it cannot give up)."""
        return [r for r in self.running.values() if r.batch_uid not in self.prefilling]

    def plan(self, guard: MemoryGuard) -> BatchPlan:
        """The batch as the memory guard sees it: the runner's KV bytes, its rows and its
        prefilling rows (whose KV may not exist yet). A runner that cannot measure its KV bytes (a
        scripted one) has its rows counted as long as its longest sequence."""
        prefills = []
        for uid in self.prefilling:
            entry = self.live.get(uid)
            if entry is not None:
                request = entry[0]
                prefills.append((sequence_tokens(request), len(request.remaining_tokens or ())))
        kv_bytes = self.kv_bytes()
        if kv_bytes is not None:
            return guard.plan(kv_bytes, len(self.running), 0, prefills)
        longest = max((sequence_tokens(r) for r in self.running.values()), default=0)
        return guard.plan(0, len(self.running), longest, prefills)

    def kv_bytes(self) -> int | None:
        """Bytes of the runner's KV buffers; None without a runner, or from one that cannot tell."""
        return self.runner.kv_bytes() if self.runner is not None else None

    # ---- the runner's end --------------------------------------------------------------------

    def drop_runner(self) -> None:
        """Discard a runner whose state is unknown after a failed step (its uids die with it)."""
        self.prefilling.clear()
        self.first_tokens_due = 0
        runner, self.runner = self.runner, None
        if runner is not None:
            try:
                runner.close()
            except Exception:  # best effort: the generator is being discarded anyway
                logger.exception("closing a failed generator raised")

    def close(self) -> None:
        """Release the runner (on the thread that stepped it)."""
        self.prefilling.clear()
        self.first_tokens_due = 0
        runner, self.runner = self.runner, None
        if runner is not None:
            runner.close()

    def clear(self) -> None:
        """Forget every request (the runner is the caller's to close)."""
        for table in (self.running, self.request_id_to_uid, self.uid_to_request_id, self.live, self.logprobs,
                      self.streams):
            table.clear()
