"""Admission paced to the generator: no more prompts than it can prefill at once, and nothing new
in a step that hands out first tokens while that pays (the real tiny model; the hold decision
alone on the scripted runner)."""

from __future__ import annotations

from engine_worker.common.config import SchedulerConfig, SchedulingPolicy
from engine_worker.common.request import Request
from engine_worker.sched.pacer import AdmissionPacer
from engine_worker.sched.scheduler import Scheduler
from tests.engine_worker.engine_helpers import final, greedy, prompt_ids, run_scheduler, solo_tokens
from tests.engine_worker.fake_runner import scripted_scheduler


class _FixedPacer(AdmissionPacer):
    """Step times fixed, so the hold decisions do not depend on this machine's speed."""

    def __init__(self, admit_ms: float, decode_ms: float) -> None:
        super().__init__()
        self.admit_s, self.decode_s = admit_ms / 1000, decode_ms / 1000

    def record(self, seconds: float, *, prompt_work: bool) -> None:
        pass


def _scheduler(model, tokenizer, pacer: AdmissionPacer | None = None, **config) -> Scheduler:
    scheduler = Scheduler(model, tokenizer, SchedulerConfig(enable_prefix_cache=False, **config))
    if pacer is not None:
        scheduler._pacer = pacer
    return scheduler


def _first_token_steps(outputs: dict) -> dict[str, int]:
    return {rid: next(o.step for o in outs if o.new_token_ids) for rid, outs in outputs.items()}


def _run(scheduler: Scheduler, arrivals: dict[int, list[Request]]):
    """Run to the end; per request its outputs (each tagged with its step), per step the
    requests it admitted, and how many were waiting after each step."""
    admitted: list[list[str]] = []
    waiting_after: list[int] = []

    def on_step(k, result):
        admitted.append(list(result.scheduled_request_ids))
        waiting_after.append(scheduler.get_num_waiting())
        for out in result.outputs:
            out.step = k

    outputs = run_scheduler(scheduler, arrivals, on_step=on_step)
    return outputs, admitted, waiting_after


def test_a_burst_enters_the_generator_a_prefill_batch_at_a_time_and_first_tokens_leave_on_steps_that_admit_nothing(tiny_model):
    model, tokenizer = tiny_model
    prompts = [prompt_ids(tokenizer, 20 + 3 * i, seed_text=f"item {i} = {i * i}\n") for i in range(12)]
    expected = [solo_tokens(model, tokenizer, p, 6) for p in prompts]
    scheduler = _scheduler(model, tokenizer, _FixedPacer(admit_ms=10, decode_ms=2), prefill_batch_size=4)
    requests = [Request(f"r{i}", p, greedy(6)) for i, p in enumerate(prompts)]

    outputs, admitted, _ = _run(scheduler, {0: requests})

    # Before: all twelve went into the generator's own queue in the first step.
    assert max(len(ids) for ids in admitted) == 4
    assert sorted(rid for ids in admitted for rid in ids) == sorted(r.request_id for r in requests)
    first = _first_token_steps(outputs)
    for step in set(first.values()):
        assert admitted[step] == [], f"step {step} handed out first tokens and admitted {admitted[step]}"
    # Each wave's first tokens come out two steps after it was admitted (prefill, then the
    # step that ends the prompts and samples), and the next wave follows them.
    waves = [ids for ids in admitted if ids]
    assert [first[ids[0]] - admitted.index(ids) for ids in waves] == [2, 2, 2]
    for i, want in enumerate(expected):
        assert final(outputs[f"r{i}"]).output_token_ids == want


def test_a_request_of_higher_priority_arriving_during_a_burst_starts_before_the_rest_of_it(tiny_model):
    model, tokenizer = tiny_model
    scheduler = _scheduler(model, tokenizer, _FixedPacer(admit_ms=10, decode_ms=2), prefill_batch_size=2,
                           policy=SchedulingPolicy.PRIORITY)
    burst = [Request(f"low{i}", prompt_ids(tokenizer, 16 + i), greedy(4), priority=5) for i in range(6)]
    urgent = Request("urgent", prompt_ids(tokenizer, 18, seed_text="now()\n"), greedy(4), priority=0)

    outputs, _, _ = _run(scheduler, {0: burst, 1: [urgent]})

    # The burst waits in the scheduler's queue, not the generator's: the urgent one takes the next
    # free prefill slot, in the urgent lane, and its first token comes before the rest of the burst's.
    first = _first_token_steps(outputs)
    assert first["urgent"] < min(first[f"low{i}"] for i in range(2, 6))
    assert all(final(outs).finish_reason == "length" for outs in outputs.values())


def test_a_deep_queue_is_admitted_without_holding_and_a_short_one_is_held():
    # Holding gains each of 4 due requests 4 ms and costs each waiter 2 ms: held below 8 waiting.
    # Pacing alone: the scripted runner, paced like mlx-lm's generator.
    scheduler = scripted_scheduler(enable_prefix_cache=False, prefill_batch_size=4)
    scheduler._pacer = _FixedPacer(admit_ms=6, decode_ms=2)
    requests = [Request(f"r{i:02d}", list(range(10, 22 + i % 5)), greedy(3)) for i in range(24)]

    outputs, admitted, waiting_after = _run(scheduler, {0: requests})

    first_token_steps = sorted(set(_first_token_steps(outputs).values()))
    deep = [k for k in first_token_steps if waiting_after[k - 1] >= 8]
    short = [k for k in first_token_steps if 0 < waiting_after[k - 1] < 8]
    assert deep and short
    assert all(admitted[k] for k in deep)
    assert not any(admitted[k] for k in short)
    assert all(final(outs).finish_reason in ("length", "stop") for outs in outputs.values())


def test_the_scheduler_times_its_admission_and_decode_steps_for_the_pacer(tiny_model):
    model, tokenizer = tiny_model
    scheduler = _scheduler(model, tokenizer, prefill_batch_size=2)
    run_scheduler(scheduler, {0: [Request(f"r{i}", prompt_ids(tokenizer, 10 + i), greedy(4)) for i in range(4)]})
    assert scheduler._pacer.admit_s > 0 and scheduler._pacer.decode_s > 0
