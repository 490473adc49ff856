"""The scheduler's per-token path: outputs are per-step snapshots, and a step's cost does not
grow with the length of the outputs (no copy of the tokens or text so far per token)."""

from __future__ import annotations

import tracemalloc

from engine_worker.common.config import SchedulerConfig
from engine_worker.common.request import Request, RequestOutput, SamplingParams
from engine_worker.sched.scheduler import Scheduler
from tests.engine_worker.engine_helpers import run_scheduler
from tests.engine_worker.fake_runner import ScriptedRunner


class CountingRunner(ScriptedRunner):
    """Tokens cycle through 100..149, so the detokenizer's table stays small for long outputs."""

    def token(self, n: int) -> int:
        return 100 + n % 50


class Tok:
    """Token t reads as "<t>"; the detokenizer's own cost is O(1) per token."""

    eos_token_ids = {2}

    class _Detok:
        def __init__(self):
            self._segment = ""

        def add_token(self, t):
            self._segment = f"<{t}>"

        def finalize(self):
            self._segment = ""

        @property
        def last_segment(self):
            segment, self._segment = self._segment, ""
            return segment

    @property
    def detokenizer(self):
        return self._Detok()

    def encode(self, text):
        return [ord(c) % 50 for c in text]


def _scheduler() -> Scheduler:
    return Scheduler(object(), Tok(), SchedulerConfig(max_num_seqs=16, enable_prefix_cache=False), runner_factory=CountingRunner,
                     max_model_len=100)


def test_every_output_holds_the_tokens_and_text_of_its_own_step_when_read_after_the_run():
    scheduler = _scheduler()
    requests = [Request(rid, "hi", SamplingParams(max_tokens=6, temperature=0.0)) for rid in ("a", "b")]
    outputs = run_scheduler(scheduler, {0: requests})
    for rid in ("a", "b"):
        tokens = [100 + k for k in range(1, 7)]
        for k, out in enumerate(outputs[rid], start=1):
            assert out.output_token_ids == tokens[:k]
            assert out.output_text == "".join(f"<{t}>" for t in tokens[:k])
            assert out.completion_tokens == k and out.finished == (k == 6)
        assert outputs[rid][-1] == RequestOutput(rid, [106], "<106>", tokens, "".join(f"<{t}>" for t in tokens),
                                                 True, "length", 2, 6)


def _bytes_kept_per_step(scheduler: Scheduler, steps: int) -> float:
    """Bytes allocated and still held after ``steps`` steps whose outputs are all kept, per step."""
    kept: list[RequestOutput] = []
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(steps):
            kept.extend(scheduler.step().outputs)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(kept) == steps * 8
    return grown / steps


def test_a_step_at_2000_tokens_keeps_no_more_memory_than_a_step_at_50():
    # Copying the tokens and text so far into every output (what the scheduler once did) keeps
    # about 8 * 2000 * (8 + 6) bytes per step at 2000 tokens, 40x what it keeps at 50.
    scheduler = _scheduler()
    for i in range(8):
        scheduler.add_request(Request(f"r{i}", "hi", SamplingParams(max_tokens=3000, temperature=0.0)))
    for _ in range(41):  # the first step only ends the prompts
        scheduler.step()
    early = _bytes_kept_per_step(scheduler, 20)
    for _ in range(1920):
        scheduler.step()
    late = _bytes_kept_per_step(scheduler, 20)
    assert scheduler.get_request("r0").num_output_tokens == 2000
    assert late < 1.5 * early, (early, late)
