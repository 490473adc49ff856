"""The scheduler keeps its batch within the memory budget: it waits, shrinks the prefix cache,
preempts, and survives a step that runs out of device memory."""

from __future__ import annotations

from dataclasses import replace

from engine_worker.common.config import SchedulerConfig
from engine_worker.common.request import Request, RequestStatus
from engine_worker.runner.device_memory import KV_STEP, ModelDims
from engine_worker.sched.memory import BatchShape, MemoryBudget, round_up
from engine_worker.sched.scheduler import Scheduler
from tests.engine_worker.engine_helpers import final, greedy, prompt_ids, run_scheduler, solo_tokens
from tests.engine_worker.fake_runner import ScriptedRunner, Tok
from tests.engine_worker.sched.test_scheduler_fake_runner import sp

# A model whose token takes 2 bytes of KV (keys and values) and nothing else.
BYTE_DIMS = ModelDims(kv_layers=1, kv_heads=1, head_dim=1, heads=0, hidden=0, intermediate=0, vocab=0,
                      dtype_bytes=1)
ROW = 3 * KV_STEP * 2  # need() of one short row with BYTE_DIMS (2 bytes a token, 2 copies + a growth step)


def _budget(rows: float, **parts) -> MemoryBudget:
    return MemoryBudget(total=int(rows * ROW), weights=0, prefix_cache=0, allocator_cache=0, dims=BYTE_DIMS, **parts)


def _scheduler(budget: MemoryBudget, **config) -> Scheduler:
    ScriptedRunner.instances.clear()
    return Scheduler(object(), Tok(), SchedulerConfig(**config), runner_factory=ScriptedRunner,
                     max_model_len=10_000, memory_budget=budget)


def test_one_short_row_needs_what_the_tests_assume():
    assert _budget(1).need(BatchShape(rows=1, kv_tokens=KV_STEP)) == ROW


def test_admission_waits_while_the_batch_would_not_fit():
    scheduler = _scheduler(_budget(2.5))
    requests = [Request(f"r{i}", "abc", sp(4)) for i in range(5)]
    peak = []
    outputs = run_scheduler(scheduler, {0: requests}, on_step=lambda *_: peak.append(len(scheduler.running)))
    assert max(peak) == 2
    assert all(final(outputs[r.request_id]).finish_reason == "length" for r in requests)
    assert scheduler.counters.num_preemptions == 0


def test_a_request_that_cannot_fit_alone_fails_with_a_reason_and_the_others_run():
    scheduler = _scheduler(_budget(1.5))
    big = Request("big", "x" * 300, sp(4))  # 300 tokens: a 512-token row, twice an empty budget's
    small = Request("small", "abc", sp(4))
    outputs = run_scheduler(scheduler, {0: [big, small]})
    out = final(outputs["big"])
    assert out.finish_reason == "error" and "memory budget" in out.error
    assert final(outputs["small"]).finish_reason == "length"


def test_a_batch_that_outgrows_the_budget_preempts_its_latest_request_which_resumes_with_its_output():
    # Two rows fit while short; at 255 tokens each (a row grows to 512) only one does.
    scheduler = _scheduler(_budget(2.9))
    first = Request("first", "a" * 200, sp(100))
    second = Request("second", "b" * 200, sp(100))
    outputs = run_scheduler(scheduler, {0: [first], 1: [second]})
    assert scheduler.counters.num_preemptions >= 1
    for rid in ("first", "second"):
        out = final(outputs[rid])
        assert out.finish_reason == "length" and out.completion_tokens == 100
        streamed = [t for o in outputs[rid] for t in o.new_token_ids]
        assert streamed == out.output_token_ids  # nothing lost or repeated across the preemption
    assert all(o.finish_reason != "error" for outs in outputs.values() for o in outs)


def test_preempting_several_requests_takes_them_out_in_one_removal():
    # Each removal copies the batch's KV: one per request would hold many copies at once.
    scheduler = _scheduler(_budget(4.5))  # four rows while short, two once they outgrow 256 tokens
    run_scheduler(scheduler, {0: [Request(f"r{i}", "a" * 200, sp(80)) for i in range(4)]})
    assert scheduler.counters.num_preemptions == 2
    assert [sorted(u) for u in ScriptedRunner.instances[0].removals if len(u) > 1] == [[2, 3]]  # the latest two


def test_a_preempted_request_waits_ahead_of_later_arrivals():
    scheduler = _scheduler(_budget(2.9))
    scheduler.add_request(Request("a", "a" * 200, sp(100)))
    scheduler.step()
    scheduler.add_request(Request("b", "b" * 200, sp(100)))
    scheduler.step()
    scheduler.add_request(Request("c", "c", sp(1)))
    while not scheduler.counters.num_preemptions:
        scheduler.step()
    waiting = [r.request_id for r in scheduler.waiting]
    assert waiting[0] == "b" and scheduler.get_request("b").status == RequestStatus.PREEMPTED
    row = next(r for r in scheduler.get_running_requests_info() if r["request_id"] == "b")
    assert row["phase"] == "preempted" and row["completion_tokens"] > 0


def test_an_allocation_failure_requeues_the_batch_and_runs_it_smaller():
    scheduler = _scheduler(_budget(1000), max_num_seqs=4)
    requests = [Request(f"r{i}", "abc", sp(6)) for i in range(4)]
    for r in requests:
        scheduler.add_request(r)
    scheduler.step()
    scheduler.step()
    ScriptedRunner.instances[-1].fail_next = RuntimeError("cudaMallocAsync failed: out of memory")
    out = scheduler.step()
    assert not any(o.finished for o in out.outputs)
    assert scheduler.get_num_running() == 0 and scheduler.get_num_waiting() == 4
    assert scheduler.counters.num_allocation_failures == 1
    sizes = []
    outputs = run_scheduler(scheduler, on_step=lambda *_: sizes.append(len(scheduler.running)))
    assert max(sizes) == 2  # half the batch that failed
    for r in requests:
        out = final(outputs[r.request_id])
        assert out.finish_reason == "length" and out.completion_tokens == 6


def test_an_allocation_failure_of_a_single_request_fails_it_alone():
    scheduler = _scheduler(_budget(1000), max_num_seqs=1)
    scheduler.add_request(Request("alone", "abc", sp(6)))
    scheduler.add_request(Request("next", "abc", sp(3)))
    scheduler.step()
    ScriptedRunner.instances[-1].fail_next = MemoryError()
    out = {o.request_id: o for o in scheduler.step().outputs}
    assert out["alone"].finish_reason == "error" and "this request alone: MemoryError()" in out["alone"].error
    assert final(run_scheduler(scheduler)["next"]).finish_reason == "length"


def test_the_batch_cap_recovers_after_a_kv_growth_interval_of_clean_steps():
    scheduler = _scheduler(_budget(1000), max_num_seqs=8)
    for i in range(8):
        scheduler.add_request(Request(f"r{i}", "abc", sp(2 * KV_STEP)))
    scheduler.step()
    ScriptedRunner.instances[-1].fail_next = RuntimeError("out of memory")
    scheduler.step()
    caps = []
    for _ in range(KV_STEP + 3):
        scheduler.step()
        caps.append(len(scheduler.running))
    assert caps[1] == 4 and caps[-1] == 8


def test_the_prefix_cache_gives_its_bytes_back_while_a_long_request_runs(tiny_model):
    model, tokenizer = tiny_model
    config = SchedulerConfig(cache_memory_mb=64)
    base = MemoryBudget.for_model(model, config, 1.0, device_bytes=1 << 30)
    long_prefill = BatchShape(rows=1, kv_tokens=round_up(701), prefill_rows=1, prefill_tokens=700, prefill_context=700)
    # While the long request prefills, the budget leaves the cache 1 MiB; short ones leave it more.
    budget = replace(base, total=base.need(long_prefill) + (1 << 20))
    scheduler = Scheduler(model, tokenizer, config, memory_budget=budget)
    for i in range(4):
        run_scheduler(scheduler, {0: [Request(f"warm{i}", prompt_ids(tokenizer, 300 + i), greedy(2))]})
    held = scheduler.prefix_cache.bytes_used
    assert held > 1 << 20  # more than the long request leaves
    scheduler.add_request(Request("long", prompt_ids(tokenizer, 700, "y = {1: 2}\n"), greedy(4)))  # a miss
    scheduler.step()
    assert scheduler.prefix_cache.bytes_used <= 1 << 20
    assert scheduler.prefix_cache.get_stats()["evictions"] > 0
    assert final(run_scheduler(scheduler)["long"]).finish_reason == "length"


def test_a_preempted_request_resumes_with_the_tokens_and_text_it_would_have_produced(tiny_model):
    model, tokenizer = tiny_model
    config = SchedulerConfig(enable_prefix_cache=False)
    p1, p2 = prompt_ids(tokenizer, 200), prompt_ids(tokenizer, 180, "x = [i * i for i in range(9)]\n")
    arrivals = {0: [Request("a", p1, greedy(100))], 1: [Request("b", p2, greedy(100))]}
    base = MemoryBudget.for_model(model, config, 1.0, device_bytes=1 << 30)
    # Room for both rows while they are shorter than 256 tokens, for one once they outgrow it.
    two_short = BatchShape(rows=2, kv_tokens=KV_STEP, prefill_rows=1, prefill_tokens=200, prefill_context=200)
    scheduler = Scheduler(model, tokenizer, config, memory_budget=replace(base, total=base.need(two_short) + 1))
    outputs = run_scheduler(scheduler, arrivals)
    assert scheduler.counters.num_preemptions >= 1
    assert final(outputs["a"]).output_token_ids == solo_tokens(model, tokenizer, p1, 100)
    assert final(outputs["b"]).output_token_ids == solo_tokens(model, tokenizer, p2, 100)
    ample = run_scheduler(Scheduler(model, tokenizer, config),
                          {0: [Request("a", p1, greedy(100))], 1: [Request("b", p2, greedy(100))]})
    assert final(outputs["b"]).output_text == final(ample["b"]).output_text
    assert "".join(o.new_text for o in outputs["b"]) == final(ample["b"]).output_text


def test_a_budgeted_batch_never_holds_more_than_its_budget(tiny_model):
    import mlx.core as mx

    from engine_worker.runner import device_memory
    from tests.engine_worker.sched.test_memory_budget import make_prompts

    model, tokenizer = tiny_model
    config = SchedulerConfig(completion_batch_size=32, enable_prefix_cache=True)
    arrivals = {0: [Request(f"r{i}", p, greedy(200, ignore_eos=True)) for i, p in enumerate(make_prompts(tokenizer, 32))]}
    base = MemoryBudget.for_model(model, config, 1.0, device_bytes=1 << 30)
    budget = replace(base, total=base.weights + (40 << 20), prefix_cache=8 << 20, allocator_cache=8 << 20)
    scheduler = Scheduler(model, tokenizer, config, memory_budget=budget)
    device_memory.apply_allocator_limits(1 << 40, budget.allocator_cache)
    mx.synchronize()
    mx.clear_cache()
    mx.reset_peak_memory()
    before = mx.get_active_memory() - budget.weights  # what other tests left alive in this process
    footprint = []
    outputs = run_scheduler(scheduler, arrivals,
                            on_step=lambda *_: footprint.append(mx.get_active_memory() + mx.get_cache_memory()))
    assert scheduler.counters.num_preemptions > 0  # the budget did bind
    assert all(final(o).completion_tokens == 200 for o in outputs.values())
    assert mx.get_peak_memory() - before <= budget.total
    assert max(footprint) - before <= budget.total


def test_after_an_injected_out_of_memory_step_the_batch_resumes_with_the_tokens_it_would_have_produced(tiny_model):
    from engine_worker.runner.generator import MlxBatchRunner

    class FailsOnce(MlxBatchRunner):
        steps = 0

        def step(self):
            FailsOnce.steps += 1
            if FailsOnce.steps == 12:  # mid-decode, after the step's Python state changed
                raise RuntimeError("cudaMallocAsync(&data, size, stream) failed: out of memory")
            return super().step()

    model, tokenizer = tiny_model
    prompts = [prompt_ids(tokenizer, 20 + 7 * i, f"n{i} = {i}\n") for i in range(4)]
    scheduler = Scheduler(model, tokenizer, SchedulerConfig(enable_prefix_cache=False), runner_factory=FailsOnce)
    outputs = run_scheduler(scheduler, {0: [Request(f"r{i}", p, greedy(24)) for i, p in enumerate(prompts)]})
    assert scheduler.counters.num_allocation_failures == 1 and scheduler.counters.num_requests_failed == 0
    for i, p in enumerate(prompts):
        assert final(outputs[f"r{i}"]).output_token_ids == solo_tokens(model, tokenizer, p, 24)
