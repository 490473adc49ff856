"""A generator step's responses, as the requests' outputs: the scheduler's per-token hot path.

For each response: the token joins its request's output and text stream (a stop token is neither,
a stop string ends the request and is cut from its text), the request finishes on ``stop`` or
``length``, and one :class:`RequestOutput` comes out, with the token's log probabilities when the
request asks for them (all of the step's in one evaluation). The caches of the requests that
finished are stored after the loop, together (one evaluation too).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from engine_worker.common.request import RequestOutput, step_output
from engine_worker.runner.logprobs import token_logprobs
from engine_worker.sched.batch import Batch
from engine_worker.sched.exits import Exits


def step_outputs(responses: Sequence[Any], batch: Batch, exits: Exits) -> list[RequestOutput]:
    """One output per response of a request still in ``batch``, in order; ends the requests
    whose response finishes them (through ``exits``)."""
    # One dict lookup per response, no per-step rebuilds, nothing O(output length): tokens and text
    # are appended, and step_output snapshots them in O(1).
    now = time.time()
    live = batch.live
    wants = batch.logprobs
    outputs: list[RequestOutput] = []
    append = outputs.append
    asking: list[tuple[RequestOutput, tuple[Any, int, int]]] = []  # outputs that want log probabilities
    try:
        for r in responses:
            entry = live.get(r.uid)
            if entry is None:  # removed earlier in this step
                continue
            request, stream = entry
            k = wants.get(r.uid) if wants else None  # before the request's end releases the uid
            if request.first_token_time is None:
                request.first_token_time = now
            reason = r.finish_reason
            if reason == "stop":
                # The token is the stop token itself: it is neither text nor output.
                new_ids: list[int] = []
                text = stream.finish()
            else:
                token = r.token
                request.output_token_ids.append(token)
                new_ids = [token]
                text = stream.add(token)
                if stream.stopped:
                    reason = "stop"
                    exits.remove_from_batch(request, stop_string=True)
                elif reason == "length":
                    text += stream.finish()
            if text:
                request.append_output_text(text)
            if reason is not None:
                exits.finish(request, reason, r.prompt_cache, r.all_tokens)
            out = step_output(request, new_ids, text, reason)
            if k is not None:
                out.new_logprobs = []
                if new_ids:
                    asking.append((out, (r.logprobs, new_ids[0], k)))
            append(out)
    finally:  # the requests finished so far are stored and unpinned even if a later one raised
        exits.store_finished()
    if asking:
        for (out, _), logprob in zip(asking, token_logprobs([row for _, row in asking]), strict=True):
            out.new_logprobs = [logprob]
    return outputs
