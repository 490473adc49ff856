"""End to end through the Scheduler: requests served from the prefix cache produce exactly the
solo greedy tokens, and ``cached_tokens`` says how much of the prompt came from the cache."""

from __future__ import annotations

import pytest

from engine_worker.cache import build_prefix_cache
from engine_worker.common.config import SchedulerConfig
from engine_worker.common.request import Request
from engine_worker.sched.scheduler import Scheduler
from tests.engine_worker.engine_helpers import final, greedy, run_scheduler, solo_tokens

MAX_TOKENS = 8


def _scheduler(tiny_model, **fields) -> Scheduler:
    model, tokenizer = tiny_model
    config = SchedulerConfig(cache_memory_mb=64, **fields)
    return Scheduler(model, tokenizer, config, prefix_cache=build_prefix_cache(model, config))


def _run(scheduler: Scheduler, rid: str, prompt: list[int]):
    scheduler.add_request(Request(rid, prompt, greedy(MAX_TOKENS)))
    return final(run_scheduler(scheduler)[rid])


@pytest.mark.parametrize("backend", [{}, {"use_memory_aware_cache": False}])
def test_cached_requests_match_their_solo_runs(tiny_model, prompts, backend):
    model, tokenizer = tiny_model
    scheduler = _scheduler(tiny_model, **backend)
    first = prompts(70)
    cold = _run(scheduler, "cold", first)
    assert cold.cached_tokens == 0
    history = first + cold.output_token_ids
    cases = {
        "exact": (first, len(first) - 1),
        "multi_turn": (history + prompts(9, variant=4), len(history)),
        "prefix_of_entry": (first[:50], 49),
        "shared_prefix": (first[:40] + prompts(15, variant=6), 40),
    }
    for rid, (prompt, expected_cached) in cases.items():
        out = _run(scheduler, rid, prompt)
        assert out.output_token_ids == solo_tokens(model, tokenizer, prompt, MAX_TOKENS), rid
        assert out.cached_tokens == expected_cached, rid
    stats = scheduler.get_cache_stats()
    assert stats["hits"] == 4 and stats["misses"] == 1


def test_paged_backend_serves_shared_system_prompt_blocks_with_parity(tiny_model, prompts):
    model, tokenizer = tiny_model
    scheduler = _scheduler(tiny_model, use_paged_cache=True, paged_cache_block_size=16)
    system = prompts(64)
    _run(scheduler, "first", system + prompts(10, variant=2))
    prompt = system + prompts(12, variant=3)
    out = _run(scheduler, "second", prompt)
    assert out.cached_tokens == 64
    assert out.output_token_ids == solo_tokens(model, tokenizer, prompt, MAX_TOKENS)
    assert scheduler.get_cache_stats()["shared_blocks"] >= 4


def test_a_batch_of_requests_sharing_a_prefix_matches_solo_runs(tiny_model, prompts):
    model, tokenizer = tiny_model
    scheduler = _scheduler(tiny_model)
    system = prompts(48)
    _run(scheduler, "warm", system + prompts(4, variant=1))
    batch = {f"r{i}": system + prompts(5 + 3 * i, variant=10 + i) for i in range(4)}
    for rid, prompt in batch.items():
        scheduler.add_request(Request(rid, prompt, greedy(MAX_TOKENS)))
    outputs = run_scheduler(scheduler)
    for rid, prompt in batch.items():
        out = final(outputs[rid])
        assert out.cached_tokens >= 48
        assert out.output_token_ids == solo_tokens(model, tokenizer, prompt, MAX_TOKENS), rid


def test_saved_cache_is_warm_in_a_restarted_scheduler(tiny_model, prompts, tmp_path):
    model, tokenizer = tiny_model
    before = _scheduler(tiny_model)
    first = prompts(60)
    cold = _run(before, "cold", first)
    assert before.save_cache_to_disk(str(tmp_path)) is True

    after = _scheduler(tiny_model)
    assert after.load_cache_from_disk(str(tmp_path)) == 1
    prompt = first + cold.output_token_ids + prompts(6, variant=8)
    out = _run(after, "warm", prompt)
    assert out.cached_tokens == len(first) + len(cold.output_token_ids)
    assert out.output_token_ids == solo_tokens(model, tokenizer, prompt, MAX_TOKENS)


def test_clear_prefix_cache_and_clear_runtime_caches_empty_the_backend(tiny_model, prompts):
    scheduler = _scheduler(tiny_model)
    _run(scheduler, "a", prompts(40))
    assert scheduler.get_cache_stats()["entries"] == 1
    scheduler.clear_prefix_cache()
    assert scheduler.get_cache_stats()["entries"] == 0
    _run(scheduler, "b", prompts(40, variant=2))
    assert scheduler.clear_runtime_caches()["memory_aware_cache"] is True
    assert scheduler.get_cache_stats()["entries"] == 0
