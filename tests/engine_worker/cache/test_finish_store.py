"""What a finished request leaves in the prefix cache (engine_worker/cache/turns.py): its prompt and
its reply, as the one latest reply to that prompt, so a load that sends the same prompts again
does not fill the cache with replies no one asks for, while a conversation's next turn still
finds its whole history."""

from __future__ import annotations

import pytest

from engine_worker.cache import build_prefix_cache
from engine_worker.common.config import SchedulerConfig
from engine_worker.common.request import Request, SamplingParams
from engine_worker.sched.scheduler import Scheduler
from tests.engine_worker.engine_helpers import final, greedy, run_scheduler

MAX_TOKENS = 12


def _scheduler(tiny_model, **fields) -> Scheduler:
    model, tokenizer = tiny_model
    config = SchedulerConfig(cache_memory_mb=64, **fields)
    return Scheduler(model, tokenizer, config, prefix_cache=build_prefix_cache(model, config))


def _sampled(seed: int) -> SamplingParams:
    return SamplingParams(max_tokens=MAX_TOKENS, temperature=1.5, seed=seed, ignore_eos=True)


@pytest.mark.parametrize("backend", [{}, {"use_memory_aware_cache": False}])
def test_a_prompt_sent_again_keeps_one_entry_its_latest_reply(tiny_model, prompts, backend):
    scheduler = _scheduler(tiny_model, **backend)
    prompt = prompts(70)
    replies = []
    for seed in range(4):  # one after the other: each finishes before the next arrives
        scheduler.add_request(Request(f"r{seed}", prompt, _sampled(seed)))
        replies.append(final(run_scheduler(scheduler)[f"r{seed}"]).output_token_ids)
    assert len({tuple(r) for r in replies}) == 4, "the seeds must give different replies"
    entries = scheduler.list_cache_entries()
    # Before: one entry of prompt + reply per request (4), none a prefix of another.
    assert len(entries) == 1
    assert entries[0]["tokens"] >= len(prompt) + MAX_TOKENS - 1  # the prompt and the latest reply


def test_many_clients_of_few_prompts_hold_one_entry_per_prompt(tiny_model, prompts):
    scheduler = _scheduler(tiny_model, completion_batch_size=16)
    few = [prompts(40, variant=v) for v in range(2)]
    for i in range(12):
        scheduler.add_request(Request(f"r{i}", few[i % 2], _sampled(i)))
    outputs = run_scheduler(scheduler)
    assert all(final(outputs[f"r{i}"]).finish_reason == "length" for i in range(12))
    # Before: 12 entries (each request's prompt + its own reply).
    assert len(scheduler.list_cache_entries()) == 2


def test_the_next_turn_of_a_conversation_still_hits_prompt_and_reply(tiny_model, prompts):
    scheduler = _scheduler(tiny_model)
    first = prompts(70)
    scheduler.add_request(Request("t1", first, greedy(MAX_TOKENS)))
    reply = final(run_scheduler(scheduler)["t1"]).output_token_ids
    history = first + reply
    scheduler.add_request(Request("t2", history + prompts(9, variant=4), greedy(MAX_TOKENS)))
    turn2 = final(run_scheduler(scheduler)["t2"])
    assert turn2.cached_tokens >= len(history) - 1  # the whole first turn, its reply too
    # The second turn's entry extends the first's, which is dropped: one entry per conversation.
    assert len(scheduler.list_cache_entries()) == 1


@pytest.mark.parametrize("backend", [{}, {"use_memory_aware_cache": False},
                                     {"use_paged_cache": True, "paged_cache_block_size": 16}])
def test_requests_finishing_in_one_step_store_their_caches_in_one_sync(tiny_model, prompts, store_evals, backend):
    scheduler = _scheduler(tiny_model, prefill_batch_size=8, **backend)
    for i in range(8):
        scheduler.add_request(Request(f"r{i}", prompts(40, variant=i), greedy(1)))
    steps: list[tuple[int, int]] = []  # (requests finished, store evals) per step

    def count(_step, result):
        steps.append((len(result.finished_request_ids), len(store_evals)))
        store_evals.clear()

    run_scheduler(scheduler, on_step=count)

    assert max(finished for finished, _ in steps) == 8  # one prefill of 8 prompts ends in one step
    # Before: one eval (a device sync) per finished request, 8 in that step.
    assert all(evals <= 1 for _, evals in steps)
    stored = len(scheduler.list_cache_entries())
    assert stored == (8 * 2 if backend.get("use_paged_cache") else 8)  # paged: two 16-token blocks each
