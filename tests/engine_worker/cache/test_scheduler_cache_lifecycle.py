"""Cache behaviour that needs the Scheduler's cooperation: aborted and mid-prefill prefixes stay
reusable, SSD promotions happen in the background while other requests decode, operator view.

The scheduler wires :mod:`engine_worker.cache.hooks` in through
:mod:`engine_worker.cache.hooks`.
"""

from __future__ import annotations

import threading

from engine_worker.common.config import SchedulerConfig
from engine_worker.common.request import Request
from engine_worker.sched.scheduler import Scheduler
from tests.engine_worker.engine_helpers import final, greedy, run_scheduler, solo_tokens


def _scheduler(tiny_model, **fields) -> Scheduler:
    model, tokenizer = tiny_model
    fields.setdefault("cache_memory_mb", 64)
    return Scheduler(model, tokenizer, SchedulerConfig(**fields))


def test_a_long_prompt_aborted_halfway_leaves_its_prefix_reusable(tiny_model, prompts):
    model, tokenizer = tiny_model
    scheduler = _scheduler(tiny_model, prefill_step_size=32)
    prompt = prompts(300)
    scheduler.add_request(Request("long", prompt, greedy(4)))
    for _ in range(3):
        scheduler.step()
    assert scheduler.get_request("long").num_output_tokens == 0  # still prefilling
    assert scheduler.abort_request("long")
    run_scheduler(scheduler)

    [row] = scheduler.list_cache_entries()
    assert 0 < row["tokens"] < len(prompt)
    scheduler.add_request(Request("again", prompt, greedy(6)))
    out = final(run_scheduler(scheduler)["again"])
    assert out.cached_tokens == row["tokens"]
    assert out.output_token_ids == solo_tokens(model, tokenizer, prompt, 6)


def test_mid_prefill_saves_make_the_processed_prefix_available_before_the_prompt_ends(tiny_model, prompts):
    scheduler = _scheduler(tiny_model, prefill_step_size=32, mid_prefill_save_interval=64)
    prompt = prompts(300)
    scheduler.add_request(Request("long", prompt, greedy(2)))
    for _ in range(5):  # 5 chunks of 32: saves at 64 and 128, each replacing the last
        scheduler.step()
    assert [row["tokens"] for row in scheduler.list_cache_entries()] == [128]
    run_scheduler(scheduler)
    assert [row["tokens"] for row in scheduler.list_cache_entries()] == [302]  # prompt + output


def test_operator_can_evict_one_entry_by_key(tiny_model, prompts):
    scheduler = _scheduler(tiny_model)
    for i in range(2):
        scheduler.add_request(Request(f"r{i}", prompts(40, variant=i), greedy(3)))
    run_scheduler(scheduler)
    rows = scheduler.list_cache_entries()
    assert len(rows) == 2
    assert scheduler.evict_cache_entry(rows[0]["key_hash"]) is True
    assert [r["key_hash"] for r in scheduler.list_cache_entries()] == [rows[1]["key_hash"]]
    assert scheduler.evict_cache_entry("no-such-key") is False


def test_ssd_promotion_happens_in_the_background_while_other_requests_decode(
        tiny_model, prompts, prefill, tmp_path, monkeypatch):
    from engine_worker.cache import entry_io

    model, tokenizer = tiny_model
    probe = prefill(prompts(64))  # KVCache buffers grow in steps of 256: count the 64 used rows
    entry_mb = 1.5 * sum(c.keys[..., :64, :].nbytes + c.values[..., :64, :].nbytes for c in probe) / 2**20
    scheduler = _scheduler(tiny_model, cache_memory_mb=entry_mb, ssd_cache_dir=str(tmp_path))
    scheduler.ssd_wait.max_wait_s = 120.0
    cache = scheduler.prefix_cache
    a, b = prompts(64, variant=1), prompts(64, variant=2)
    cache.store(a, prefill(a))
    cache.store(b, prefill(b))  # a goes to disk
    assert cache.ssd_tier.flush(timeout=30)

    gate = threading.Event()
    real_read = entry_io.read_file

    def slow_read(*args, **kwargs):
        gate.wait(60)
        return real_read(*args, **kwargs)

    monkeypatch.setattr(entry_io, "read_file", slow_read)
    scheduler.add_request(Request("busy", prompts(20, variant=3), greedy(40, ignore_eos=True)))
    while scheduler.get_request("busy").num_output_tokens == 0:
        scheduler.step()  # "busy" is decoding from here on: one token per step
    prompt = a + prompts(6, variant=9)
    scheduler.add_request(Request("from_disk", prompt, greedy(6)))
    outputs = {}
    for _ in range(6):  # the disk read is blocked: "busy" keeps decoding, "from_disk" waits
        for out in scheduler.step().outputs:
            outputs.setdefault(out.request_id, []).append(out)
    assert len(outputs["busy"]) == 6
    assert "from_disk" not in outputs and scheduler.get_request("from_disk").batch_uid is None

    gate.set()
    rest = run_scheduler(scheduler)
    out = final(rest["from_disk"])
    assert scheduler.get_request("from_disk").cache_hit_type == "ssd_hit"
    assert out.cached_tokens == len(a)
    assert out.output_token_ids == solo_tokens(model, tokenizer, prompt, 6)
    assert cache.get_stats()["promotions"] == 1
    scheduler.deep_reset()


def test_engine_core_lists_and_evicts_entries_between_steps(tiny_model, prompts):
    from engine_worker.common.config import EngineConfig
    from engine_worker.engine_core import EngineCore

    model, tokenizer = tiny_model
    engine = EngineCore(model, tokenizer, EngineConfig(scheduler_config=SchedulerConfig(cache_memory_mb=64)))
    try:
        engine.generate_batch_sync([prompts(40, variant=i) for i in range(2)], greedy(3))
        rows = engine.list_cache_entries()
        assert len(rows) == 2 and all(row["tier"] for row in rows)
        assert engine.evict_cache_entry(rows[0]["key_hash"]) is True
        assert [r["key_hash"] for r in engine.list_cache_entries()] == [rows[1]["key_hash"]]
        assert engine.evict_cache_entry("no-such-key") is False
    finally:
        engine.close()


def test_without_a_cache_the_operator_view_is_empty_and_aborts_store_nothing(tiny_model, prompts):
    scheduler = _scheduler(tiny_model, enable_prefix_cache=False, prefill_step_size=32)
    scheduler.add_request(Request("long", prompts(300), greedy(4)))
    scheduler.step()
    assert scheduler.abort_request("long")
    run_scheduler(scheduler)
    assert scheduler.list_cache_entries() == [] and scheduler.evict_cache_entry("x") is False
    assert scheduler.ssd_wait is None
