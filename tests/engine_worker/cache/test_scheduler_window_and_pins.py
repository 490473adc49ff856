"""Two cache behaviours that need the Scheduler's cooperation:

* under ``max_kv_size`` a prompt longer than the sliding window leaves a cache that cannot be
  trimmed, so the scheduler also stores a prompt-only snapshot (seed S37): the same prompt with
  another follow-up hits it, with the tokens of a cold run;
* the paged back end's blocks that a running request was served from stay pinned (the scheduler
  passes the request id through the seam) until the request ends: a full pool evicts only the
  others.
"""

from __future__ import annotations

from engine_worker.common.config import SchedulerConfig
from engine_worker.common.request import Request
from engine_worker.sched.scheduler import Scheduler
from tests.engine_worker.engine_helpers import final, greedy, run_scheduler

WINDOW = 32


def _run(scheduler: Scheduler, rid: str, prompt: list[int], max_tokens: int = 6):
    scheduler.add_request(Request(rid, prompt, greedy(max_tokens, ignore_eos=True)))
    return final(run_scheduler(scheduler)[rid])


def _cold(tiny_model, prompt: list[int], max_tokens: int = 6) -> list[int]:
    """The same sliding window, no prefix cache: the reference tokens."""
    model, tokenizer = tiny_model
    config = SchedulerConfig(enable_prefix_cache=False, max_kv_size=WINDOW)
    return _run(Scheduler(model, tokenizer, config), "cold", prompt, max_tokens).output_token_ids


def test_a_prompt_longer_than_the_window_is_also_stored_alone_and_serves_a_new_follow_up(
        tiny_model, prompts):
    model, tokenizer = tiny_model
    scheduler = Scheduler(model, tokenizer, SchedulerConfig(cache_memory_mb=64, max_kv_size=WINDOW))
    prompt = prompts(80)
    first = _run(scheduler, "turn1", prompt)
    history = prompt + first.output_token_ids
    # The prompt alone, next to the prompt+output entry (a wrapped window dominates no prefix).
    assert sorted(row["tokens"] for row in scheduler.list_cache_entries()) == [80, len(history)]

    other_follow_up = prompt + prompts(12, variant=5)
    out = _run(scheduler, "other", other_follow_up)
    assert out.cached_tokens == len(prompt)
    assert out.output_token_ids == _cold(tiny_model, other_follow_up)

    next_turn = history + prompts(9, variant=7)
    out = _run(scheduler, "turn2", next_turn)
    assert out.cached_tokens == len(history)
    assert out.output_token_ids == _cold(tiny_model, next_turn)


def test_a_prompt_inside_the_window_gets_no_extra_snapshot(tiny_model, prompts):
    model, tokenizer = tiny_model
    scheduler = Scheduler(model, tokenizer, SchedulerConfig(cache_memory_mb=64, max_kv_size=64))
    first = _run(scheduler, "short", prompts(40))
    assert [row["tokens"] for row in scheduler.list_cache_entries()] == [40 + len(first.output_token_ids)]


def _paged_scheduler(tiny_model) -> Scheduler:
    model, tokenizer = tiny_model
    config = SchedulerConfig(use_paged_cache=True, paged_cache_block_size=16, max_cache_blocks=8)
    return Scheduler(model, tokenizer, config)


def test_full_paged_pool_never_evicts_the_blocks_of_a_running_request(tiny_model, prompts):
    scheduler = _paged_scheduler(tiny_model)
    manager = scheduler.prefix_cache.manager
    shared = prompts(64)
    _run(scheduler, "warm", shared, max_tokens=4)  # 68 tokens cached: 4 blocks

    scheduler.add_request(Request("long", shared + prompts(8, variant=3), greedy(60, ignore_eos=True)))
    scheduler.step()
    assert scheduler.get_request("long").cached_tokens == 64
    pinned = {b.chain_hash: b.block_id for b in manager.blocks() if b.ref_count > 0}
    stats = scheduler.get_cache_stats()
    assert len(pinned) == 4 and stats["blocks_in_use"] == 4 and stats["requests_holding_blocks"] == 1
    assert scheduler.evict_cache_entry(str(next(iter(pinned.values())))) is False

    # Other requests fill the pool (3 blocks each, 4 free slots) while "long" decodes.
    for i in range(3):
        scheduler.add_request(Request(f"fill{i}", prompts(48, variant=10 + i), greedy(4, ignore_eos=True)))
    while any(not scheduler.get_request(f"fill{i}").is_finished() for i in range(3)):
        scheduler.step()
    assert not scheduler.get_request("long").is_finished()
    assert scheduler.get_cache_stats()["evictions"] > 0
    assert all(manager.lookup(h) is not None and manager.lookup(h).ref_count > 0 for h in pinned)

    run_scheduler(scheduler)  # "long" finishes: its blocks are released
    stats = scheduler.get_cache_stats()
    assert stats["blocks_in_use"] == 0 and stats["requests_holding_blocks"] == 0
    for i in range(3):  # 9 new blocks in a pool of 8: everything older goes
        _run(scheduler, f"late{i}", prompts(48, variant=20 + i), max_tokens=4)
    assert all(manager.lookup(h) is None for h in pinned)


def test_aborted_and_reset_paged_requests_release_their_blocks(tiny_model, prompts):
    scheduler = _paged_scheduler(tiny_model)
    shared = prompts(64)
    _run(scheduler, "warm", shared, max_tokens=4)
    for rid in ("aborted", "other"):
        scheduler.add_request(Request(rid, shared + prompts(8, variant=4), greedy(30, ignore_eos=True)))
    scheduler.step()
    assert scheduler.get_cache_stats()["requests_holding_blocks"] == 2
    assert scheduler.abort_request("aborted")
    assert scheduler.get_cache_stats()["requests_holding_blocks"] == 1
    scheduler.reset()  # aborts the other one too
    stats = scheduler.get_cache_stats()
    assert stats["requests_holding_blocks"] == 0 and stats["blocks_in_use"] == 0


class _Recorder:
    active = True

    def __init__(self) -> None:
        self.keys: list[list[int]] = []

    def store(self, tokens, cache_layers) -> None:
        self.keys.append(list(tokens))


def test_prompt_snapshot_keys_on_exactly_the_tokens_the_cache_covers(tiny_model, prompts):
    import mlx.core as mx
    from mlx_lm.models.cache import RotatingKVCache, make_prompt_cache

    from engine_worker.cache.hooks import store_prompt_snapshot

    model, _ = tiny_model
    prompt, first_token = prompts(40), 7

    def cache_over(tokens, rotating=True):
        layers = ([RotatingKVCache(max_size=16, keep=4) for _ in model.layers] if rotating
                  else make_prompt_cache(model))
        model(mx.array([tokens]), cache=layers)
        return layers, tokens

    backend = _Recorder()
    assert store_prompt_snapshot(backend, prompt, cache_over(prompt[:30])) is None  # still prefilling
    assert store_prompt_snapshot(backend, prompt, (None, [])) is None  # queued, no cache yet
    assert store_prompt_snapshot(backend, prompt, cache_over(prompt, rotating=False)) is False  # trimmable
    assert store_prompt_snapshot(backend, prompt, cache_over(prompt)) is True
    assert store_prompt_snapshot(backend, prompt, cache_over(prompt + [first_token])) is True
    assert store_prompt_snapshot(backend, prompt, cache_over(prompt + [first_token, 9])) is False
    assert backend.keys == [prompt, prompt + [first_token]]
