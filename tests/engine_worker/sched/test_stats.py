"""Stats: the seed's dashboard rows, a correct tokens/s, memory figures in bytes with a device."""

from __future__ import annotations

from engine_worker.common.config import SchedulerConfig
from engine_worker.common.request import Request
from engine_worker.runner import device_memory
from engine_worker.sched.scheduler import Scheduler
from engine_worker.sched.stats import running_row
from tests.engine_worker.engine_helpers import greedy, prompt_ids
from tests.engine_worker.fake_runner import scripted_scheduler

SEED_ROW_FIELDS = [
    "request_id", "status", "phase", "elapsed_s", "prompt_tokens", "completion_tokens", "max_tokens",
    "progress", "tokens_per_second", "ttft_s", "cache_hit_type", "cached_tokens",
]


def test_rows_have_exactly_the_seed_fields_waiting_first():
    scheduler = scripted_scheduler()  # the rows need no model: the scripted runner
    scheduler.add_request(Request("run", list(range(10, 16)), greedy(50, ignore_eos=True)))
    for _ in range(3):
        scheduler.step()
    scheduler.add_request(Request("wait", list(range(20, 26)), greedy(5)))
    rows = scheduler.get_running_requests_info()
    assert [list(r) for r in rows] == [SEED_ROW_FIELDS, SEED_ROW_FIELDS]
    waiting, running = rows
    assert (waiting["request_id"], waiting["status"], waiting["phase"]) == ("wait", "waiting", "queued")
    assert (running["request_id"], running["status"], running["phase"]) == ("run", "running", "generation")
    assert running["prompt_tokens"] == 6 and running["max_tokens"] == 50
    assert running["completion_tokens"] >= 1 and running["cache_hit_type"] == "miss"
    scheduler.reset()


def test_tokens_per_second_excludes_the_wait_for_the_first_token():
    request = Request("r", [1, 2, 3], greedy(100), arrival_time=100.0)
    request.num_prompt_tokens = 3
    request.status = request.status.RUNNING
    request.first_token_time = 110.0  # a 10 s queue/prefill wait
    request.output_token_ids = list(range(21))
    row = running_row(request, now=112.0)
    assert row["tokens_per_second"] == 10.0  # 20 tokens after the first, in 2 s
    assert row["ttft_s"] == 10.0
    assert row["progress"] == 0.21
    assert row["elapsed_s"] == 12.0
    request.output_token_ids = [7]
    assert running_row(request, now=112.0)["tokens_per_second"] is None


def test_scheduler_stats_count_tokens_and_report_memory_in_bytes_with_the_device(tiny_model):
    model, tokenizer = tiny_model
    scheduler = Scheduler(model, tokenizer)
    scheduler.add_request(Request("r", prompt_ids(tokenizer, 7), greedy(4, ignore_eos=True)))
    while scheduler.has_requests():
        scheduler.step()
    stats = scheduler.get_stats()
    assert stats["num_requests_processed"] == 1
    assert stats["total_prompt_tokens"] == 7 and stats["total_completion_tokens"] == 4
    mem = stats["memory"]
    assert mem["device"] in ("cpu", "cuda", "metal", "gpu")
    assert mem["device"] == device_memory.device_label()
    assert isinstance(mem["active_bytes"], int) and mem["active_bytes"] > 1_000_000  # the weights
    assert mem["peak_bytes"] >= mem["active_bytes"]
    assert isinstance(stats["memory_aware_cache"], dict)  # the seed's default back end


def test_stats_carry_no_cache_section_when_prefix_caching_is_off(tiny_model):
    model, tokenizer = tiny_model
    scheduler = Scheduler(model, tokenizer, SchedulerConfig(enable_prefix_cache=False))
    stats = scheduler.get_stats()
    assert not {"memory_aware_cache", "paged_cache", "prefix_cache"} & set(stats)
    assert scheduler.get_cache_stats() is None


def test_seed_metal_keys_appear_only_for_metal():
    stats = {"device": "metal", "active_bytes": 2_500_000_000, "peak_bytes": 3e9, "cache_bytes": 0}
    assert device_memory.seed_memory_keys(stats) == {
        "metal_active_memory_gb": 2.5, "metal_peak_memory_gb": 3.0, "metal_cache_memory_gb": 0.0}
    assert device_memory.seed_memory_keys({**stats, "device": "cpu"}) == {}


def test_generated_tokens_are_counted_at_every_step_not_when_requests_finish(tiny_model):
    model, tokenizer = tiny_model
    scheduler = Scheduler(model, tokenizer)
    scheduler.add_request(Request("long", prompt_ids(tokenizer, 5), greedy(200, ignore_eos=True)))
    while scheduler.get_request("long").num_output_tokens < 10:
        scheduler.step()
    counters = scheduler.get_stats()["counters"]
    # The request runs on: nothing is finished, yet every token it produced is counted.
    assert counters["total_completion_tokens"] == 0
    assert counters["total_generated_tokens"] >= 10
    scheduler.reset()
