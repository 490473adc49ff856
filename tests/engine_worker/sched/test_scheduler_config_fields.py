"""Every SchedulerConfig field the scheduler owns does what it says. The admission fields and
policies are scheduling alone and run on the scripted runner; the rest on the real tiny model."""

from __future__ import annotations

import logging

from engine_worker.cache.protocol import PrefixCacheBackend
from engine_worker.common.config import SchedulerConfig, SchedulingPolicy
from engine_worker.common.request import Request
from engine_worker.sched.scheduler import Scheduler
from tests.engine_worker.engine_helpers import final, greedy, prompt_ids, run_scheduler, solo_tokens
from tests.engine_worker.fake_runner import scripted_scheduler


class RecordingCache(PrefixCacheBackend):
    """A prefix-cache back end that keeps every stored entry and serves the longest prefix."""

    name = "prefix_cache"
    active = True

    def __init__(self) -> None:
        self.entries: list[tuple[list[int], list]] = []
        self.fetches = 0

    def fetch(self, tokens):
        self.fetches += 1
        best = None
        for key, cache in self.entries:
            if len(key) < len(tokens) and list(tokens[: len(key)]) == key:
                if best is None or len(key) > len(best[0]):
                    best = (key, cache)
        if best is None:
            return None, list(tokens), "miss"
        return best[1], list(tokens[len(best[0]):]), "prefix"

    def store(self, tokens, cache_layers):
        self.entries.append((list(tokens), cache_layers))

    def get_stats(self):
        return {"entries": len(self.entries)}

    def clear(self):
        self.entries.clear()


def _prompt(n: int) -> list[int]:
    """A prompt of ``n`` token ids, for the scripted runner."""
    return list(range(10, 10 + n))


def test_max_num_seqs_caps_the_running_batch():
    scheduler = scripted_scheduler(max_num_seqs=3)
    requests = [Request(f"r{i}", _prompt(5 + i), greedy(4, ignore_eos=True)) for i in range(7)]
    seen = []
    outputs = run_scheduler(scheduler, {0: requests}, on_step=lambda k, o: seen.append(scheduler.get_num_running()))
    assert max(seen) == 3
    assert len(outputs) == 7 and all(final(o).completion_tokens == 4 for o in outputs.values())


def test_max_num_batched_tokens_bounds_prompt_tokens_admitted_per_step():
    scheduler = scripted_scheduler(max_num_batched_tokens=45)
    sizes = [20, 20, 20, 60, 10]
    requests = [Request(f"r{i}", _prompt(n), greedy(3, ignore_eos=True)) for i, n in enumerate(sizes)]
    admitted = []
    run_scheduler(scheduler, {0: requests},
                  on_step=lambda k, o: admitted.append((o.scheduled_request_ids, o.num_scheduled_tokens)))
    per_step = [a for a in admitted if a[0]]
    assert per_step[0] == (["r0", "r1"], 40)
    # A prompt above the budget is admitted alone (otherwise it would starve).
    assert (["r3"], 60) in per_step
    assert all(n <= 45 or len(ids) == 1 for ids, n in per_step)
    assert sorted(r for ids, _ in per_step for r in ids) == [f"r{i}" for i in range(5)]


def _admission_order(policy):
    scheduler = scripted_scheduler(max_num_seqs=1, policy=policy)
    requests = [
        Request("first", _prompt(5), greedy(2, ignore_eos=True), priority=9),
        Request("low_a", _prompt(5), greedy(2, ignore_eos=True), priority=5, arrival_time=10.0),
        Request("low_b", _prompt(5), greedy(2, ignore_eos=True), priority=5, arrival_time=11.0),
        Request("urgent", _prompt(5), greedy(2, ignore_eos=True), priority=0, arrival_time=12.0),
    ]
    order: list[str] = []
    run_scheduler(scheduler, {0: requests[:1], 1: requests[1:]},
                  on_step=lambda k, o: order.extend(o.scheduled_request_ids))
    return order


def test_priority_policy_admits_by_priority_then_arrival():
    # "first" (priority 9) gives its slot to the more urgent arrivals and resumes after them.
    assert _admission_order(SchedulingPolicy.PRIORITY) == [
        "first", "urgent", "low_a", "low_b", "first"]


def test_fcfs_policy_admits_by_arrival_whatever_the_priority():
    assert _admission_order(SchedulingPolicy.FCFS) == ["first", "low_a", "low_b", "urgent"]


def test_batch_sizes_and_prefill_step_reach_the_generator(tiny_model):
    model, tokenizer = tiny_model
    scheduler = Scheduler(model, tokenizer, SchedulerConfig(
        prefill_batch_size=3, completion_batch_size=5, prefill_step_size=100, chunked_prefill_tokens=40))
    run_scheduler(scheduler, {0: [Request("r", prompt_ids(tokenizer, 5), greedy(2))]})
    gen = scheduler.batch_generator
    assert (gen.prefill_batch_size, gen.completion_batch_size, gen.prefill_step_size) == (3, 5, 40)
    plain = Scheduler(model, tokenizer, SchedulerConfig(prefill_step_size=100))
    run_scheduler(plain, {0: [Request("r", prompt_ids(tokenizer, 5), greedy(2))]})
    assert plain.batch_generator.prefill_step_size == 100


def _tokens_during_long_prefill(model, tokenizer, config):
    scheduler = Scheduler(model, tokenizer, config)
    scheduler.add_request(Request("running", prompt_ids(tokenizer, 8), greedy(200, ignore_eos=True)))
    while scheduler.get_request("running").num_output_tokens == 0:
        scheduler.step()
    scheduler.add_request(Request("long", prompt_ids(tokenizer, 640), greedy(2, ignore_eos=True)))
    before = scheduler.get_request("running").num_output_tokens
    while scheduler.get_request("long").num_output_tokens == 0:
        scheduler.step()
    during = scheduler.get_request("running").num_output_tokens - before
    scheduler.reset()
    return during


def test_chunked_prefill_keeps_running_requests_decoding_during_a_long_prefill(tiny_model):
    model, tokenizer = tiny_model
    chunked = _tokens_during_long_prefill(model, tokenizer, SchedulerConfig(chunked_prefill_tokens=32))
    whole = _tokens_during_long_prefill(model, tokenizer, SchedulerConfig())
    assert chunked >= 15  # 640 tokens in chunks of 32: ~20 steps, each also decoding "running"
    assert whole <= 3


def test_max_kv_size_bounds_the_kv_cache_of_each_request(tiny_model):
    model, tokenizer = tiny_model
    caches = {}
    for bound in (0, 24):
        backend = RecordingCache()
        scheduler = Scheduler(model, tokenizer, SchedulerConfig(max_kv_size=bound), prefix_cache=backend)
        run_scheduler(scheduler, {0: [Request("r", prompt_ids(tokenizer, 60), greedy(10, ignore_eos=True))]})
        (tokens, layers), = backend.entries
        assert len(tokens) == 70
        caches[bound] = max(layer.keys.shape[2] for layer in layers)
    assert caches[0] >= 70
    assert caches[24] <= 24


def test_prefix_cache_backend_is_asked_at_admission_and_its_hit_is_reused_exactly(tiny_model):
    model, tokenizer = tiny_model
    backend = RecordingCache()
    scheduler = Scheduler(model, tokenizer, prefix_cache=backend)
    first_prompt = prompt_ids(tokenizer, 30)
    first = final(run_scheduler(scheduler, {0: [Request("t1", first_prompt, greedy(8, ignore_eos=True))]})["t1"])
    follow_up = first_prompt + first.output_token_ids + prompt_ids(tokenizer, 6, seed_text="x = 1\n")
    second = final(run_scheduler(scheduler, {0: [Request("t2", follow_up, greedy(8))]})["t2"])
    assert second.cached_tokens == 38
    assert second.output_token_ids == solo_tokens(model, tokenizer, follow_up, 8)
    assert scheduler.get_stats()["counters"]["total_cached_tokens"] == 38
    assert scheduler.get_cache_stats() == {"entries": 2}


def test_enable_mtp_without_an_mtp_head_is_reported_in_a_warning_and_in_stats(tiny_model, caplog):
    model, tokenizer = tiny_model
    with caplog.at_level(logging.WARNING, logger="engine_worker.sched.stats"):
        scheduler = Scheduler(model, tokenizer, SchedulerConfig(enable_mtp=True))
    assert "no MTP head" in caplog.text
    mtp = scheduler.get_stats()["mtp"]
    assert mtp["enabled"] is False and mtp["requested"] is True and "no MTP head" in mtp["reason"]
    assert "mtp" not in Scheduler(model, tokenizer).get_stats()


def test_cache_fields_set_to_non_defaults_do_not_break_generation(tiny_model, tmp_path):
    model, tokenizer = tiny_model
    config = SchedulerConfig(
        enable_prefix_cache=True, use_paged_cache=True, paged_cache_block_size=16, max_cache_blocks=50,
        use_memory_aware_cache=False, kv_cache_quantization=True, ssd_cache_dir=str(tmp_path),
        mid_prefill_save_interval=64, prefix_cache_size=3, cache_memory_mb=8,
    )
    p = prompt_ids(tokenizer, 20)
    scheduler = Scheduler(model, tokenizer, config)
    out = final(run_scheduler(scheduler, {0: [Request("r", p, greedy(6))]})["r"])
    assert out.output_token_ids == solo_tokens(model, tokenizer, p, 6)
