"""Where the engine thread puts a request's outputs: an asyncio collector or a blocking waiter."""

from __future__ import annotations

import asyncio
import threading

from engine_worker.common.request import RequestOutput, replace_new


def merge_outputs(outputs: list[RequestOutput]) -> RequestOutput:
    """One output covering several steps: the new pieces concatenated, the totals from the last."""
    new_ids: list[int] = []
    for out in outputs:
        new_ids += out.new_token_ids
    # replace_new, not dataclasses.replace: the totals stay lazy snapshots (see step_output).
    merged = replace_new(outputs[-1], new_ids, "".join(out.new_text for out in outputs))
    if any(out.new_logprobs is not None for out in outputs):  # one entry per token, as for each step
        merged.new_logprobs = [e for out in outputs for e in (out.new_logprobs or ())]
    return merged


class AsyncCollector:
    """A request's outputs for a consumer on one asyncio loop.

    ``put`` runs on the loop's thread (the engine schedules it with ``call_soon_threadsafe``).
    Outputs not yet taken are merged, so a slow consumer gets one combined output instead of a
    backlog. The merge happens once, when the consumer takes them: ``put`` only appends, because
    it runs for every request at every step and a lagging consumer is the normal case under load.
    The consumer is woken every ``stream_interval`` tokens, and always on the last output.
    A bare future is the wake-up (cheaper than ``asyncio.Event``: this runs for every request at
    every step).
    """

    __slots__ = ("loop", "stream_interval", "abandoned", "_pending", "_ready", "_waiter", "_last_sent")

    def __init__(self, loop: asyncio.AbstractEventLoop, stream_interval: int = 1) -> None:
        self.loop = loop
        self.stream_interval = stream_interval
        self.abandoned = False  # aborted through the API: drop it once its last output arrives
        self._pending: list[RequestOutput] = []
        self._ready = False
        self._waiter: asyncio.Future[None] | None = None
        self._last_sent = 0

    def put(self, out: RequestOutput) -> None:
        self._pending.append(out)
        if (
            self.stream_interval == 1
            or out.finished
            or out.completion_tokens - self._last_sent >= self.stream_interval
        ):
            self._ready = True
            waiter = self._waiter
            if waiter is not None:
                self._waiter = None
                if not waiter.done():
                    waiter.set_result(None)

    async def get(self) -> RequestOutput:
        while not self._ready:
            waiter = self._waiter = self.loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        pending, self._pending, self._ready = self._pending, [], False
        out = pending[0] if len(pending) == 1 else merge_outputs(pending)
        self._last_sent = out.completion_tokens
        return out


class SyncWaiter:
    """Collects the final outputs of a group of requests for a blocking caller (any thread)."""

    def __init__(self, request_ids: list[str]) -> None:
        self._remaining = set(request_ids)
        self.finals: dict[str, RequestOutput] = {}
        self._done = threading.Event()
        if not self._remaining:
            self._done.set()

    def put(self, out: RequestOutput) -> None:
        if out.finished and out.request_id in self._remaining:
            self.finals[out.request_id] = out
            self._remaining.discard(out.request_id)
            if not self._remaining:
                self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)


def deliver(items: list[tuple[AsyncCollector, RequestOutput]]) -> None:
    """Put each output into its collector; runs on the collectors' event loop (the engine thread
    schedules it there with ``call_soon_threadsafe``, once per loop per step)."""
    for collector, out in items:
        collector.put(out)
