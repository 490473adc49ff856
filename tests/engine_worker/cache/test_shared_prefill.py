"""Prompts that arrive together and share a long prefix prefill it once
(:mod:`engine_worker.cache.shared_prefill`), and generate what they would alone."""

from __future__ import annotations

from engine_worker.cache.shared_prefill import MIN_GAIN_TOKENS
from engine_worker.common.config import SchedulerConfig
from engine_worker.common.request import Request
from engine_worker.sched.scheduler import Scheduler
from tests.engine_worker.engine_helpers import final, greedy, run_scheduler, solo_tokens

SHARED = 400  # a system prompt's tokens


def _burst(tiny_model, prompts, n: int, *, own: int = 20) -> tuple[list[list[int]], Scheduler]:
    model, tokenizer = tiny_model
    system = prompts(SHARED)
    bodies = [system + prompts(own, variant=i + 1) for i in range(n)]
    scheduler = Scheduler(model, tokenizer, SchedulerConfig(cache_memory_mb=64, prefill_batch_size=8))
    for i, body in enumerate(bodies):
        scheduler.add_request(Request(f"r{i}", body, greedy(4)))
    return bodies, scheduler


def test_a_burst_sharing_a_system_prompt_prefills_it_once_and_each_output_is_its_own(tiny_model, prompts):
    model, tokenizer = tiny_model
    bodies, scheduler = _burst(tiny_model, prompts, 6)
    outputs = run_scheduler(scheduler)

    finals = [final(outputs[f"r{i}"]) for i in range(len(bodies))]
    assert finals[0].cached_tokens == 0  # the leader prefills the shared part
    assert all(f.cached_tokens >= SHARED for f in finals[1:]), [f.cached_tokens for f in finals]
    # Six prompts of 420 tokens, prefilled as one whole prompt and five suffixes.
    assert scheduler.counters.total_prefilled_tokens < len(bodies[0]) + 5 * (len(bodies[0]) - SHARED) + 5
    for body, out in zip(bodies, finals, strict=True):
        assert out.output_token_ids == solo_tokens(model, tokenizer, body, 4)


def test_prompts_sharing_less_than_the_minimum_are_admitted_together(tiny_model, prompts):
    model, tokenizer = tiny_model
    system = prompts(MIN_GAIN_TOKENS - 40)
    scheduler = Scheduler(model, tokenizer, SchedulerConfig(cache_memory_mb=64, prefill_batch_size=8))
    for i in range(4):
        scheduler.add_request(Request(f"r{i}", system + prompts(30, variant=i + 1), greedy(2)))
    first = scheduler.step()
    assert len(first.scheduled_request_ids) == 4  # nobody waits for a prefill that saves it little
    outputs = run_scheduler(scheduler)
    assert all(final(outputs[f"r{i}"]).cached_tokens == 0 for i in range(4))


def test_followers_of_an_aborted_leader_run_without_waiting_for_it(tiny_model, prompts):
    model, tokenizer = tiny_model
    bodies, scheduler = _burst(tiny_model, prompts, 3)
    first = scheduler.step()
    assert first.scheduled_request_ids == ["r0"]  # r1 and r2 follow r0's prefill
    assert scheduler.abort_request("r0")
    outputs = run_scheduler(scheduler)
    for i in (1, 2):
        assert final(outputs[f"r{i}"]).output_token_ids == solo_tokens(model, tokenizer, bodies[i], 4)


def test_followers_wait_once_even_when_the_cache_cannot_keep_the_leaders_prompt(tiny_model, prompts):
    model, tokenizer = tiny_model
    system = prompts(SHARED)
    # A budget far below one entry: every store is refused, so no follower ever hits.
    scheduler = Scheduler(model, tokenizer, SchedulerConfig(cache_memory_mb=0.01, prefill_batch_size=8))
    for i in range(4):
        scheduler.add_request(Request(f"r{i}", system + prompts(20, variant=i + 1), greedy(4)))
    scheduled = [scheduler.step().scheduled_request_ids for _ in range(6)]
    admitted = [ids for ids in scheduled if ids]
    assert admitted[0] == ["r0"]
    assert sorted(admitted[1]) == ["r1", "r2", "r3"]  # together, not one leader after another
    outputs = run_scheduler(scheduler)
    for i in range(1, 4):
        assert final(outputs[f"r{i}"]).output_token_ids == solo_tokens(
            model, tokenizer, system + prompts(20, variant=i + 1), 4)
