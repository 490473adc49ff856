"""With the PRIORITY policy a full batch gives way: a more urgent request that arrives takes the
place of the least urgent decoding one, which waits and resumes with the same greedy tokens
(the real tiny model); otherwise the newcomer waits (scheduling alone: the scripted runner)."""

from __future__ import annotations

from engine_worker.common.config import SchedulerConfig, SchedulingPolicy
from engine_worker.common.request import Request
from engine_worker.sched.scheduler import Scheduler
from tests.engine_worker.engine_helpers import final, greedy, prompt_ids, run_scheduler, solo_tokens
from tests.engine_worker.fake_runner import scripted_scheduler

LONG = 40


def _scheduler(model, tokenizer, policy: SchedulingPolicy) -> Scheduler:
    # A batch of two: two long low-priority requests fill it.
    return Scheduler(model, tokenizer, SchedulerConfig(enable_prefix_cache=False, completion_batch_size=2,
                                                       prefill_batch_size=2, policy=policy))


def _requests(tokenizer, urgent_priority: int) -> tuple[list[Request], Request]:
    low = [Request(f"low{i}", prompt_ids(tokenizer, 12 + i), greedy(LONG), priority=100) for i in range(2)]
    urgent = Request("urgent", prompt_ids(tokenizer, 14, seed_text="now()\n"), greedy(4), priority=urgent_priority)
    return low, urgent


def _first_token_step(outputs: dict, rid: str) -> int:
    return next(o.step for o in outputs[rid] if o.new_token_ids)


def _last_step(outputs: dict, rid: str) -> int:
    return final(outputs[rid]).step


def _run_stepped(scheduler: Scheduler, low: list[Request], urgent: Request) -> dict:
    """Per request, its outputs, each tagged with the step that produced it; ``urgent`` arrives
    at step 5, when both low requests decode."""

    def on_step(k, result):
        for out in result.outputs:
            out.step = k

    return run_scheduler(scheduler, {0: low, 5: [urgent]}, on_step=on_step)


def test_a_more_urgent_request_preempts_the_least_urgent_and_everyone_keeps_their_tokens(tiny_model):
    model, tokenizer = tiny_model
    scheduler = _scheduler(model, tokenizer, SchedulingPolicy.PRIORITY)
    low, urgent = _requests(tokenizer, urgent_priority=0)

    outputs = _run_stepped(scheduler, low, urgent)

    # It starts within two steps of its arrival, long before either low request ends.
    assert _first_token_step(outputs, "urgent") <= 7
    assert _last_step(outputs, "urgent") < min(_last_step(outputs, r.request_id) for r in low)
    assert scheduler.counters.num_preemptions == 1
    # The preempted request resumed from its prompt and output so far: greedy, the same tokens.
    for request in [*low, urgent]:
        assert final(outputs[request.request_id]).output_token_ids == solo_tokens(model, tokenizer, request.prompt_token_ids, request.sampling_params.max_tokens)
        assert final(outputs[request.request_id]).finish_reason in ("length", "stop")


def test_under_fcfs_or_at_equal_priority_a_full_batch_makes_the_newcomer_wait():
    # Scheduling alone: the scripted runner, with the same batch of two.
    for policy, urgent_priority in ((SchedulingPolicy.FCFS, 0), (SchedulingPolicy.PRIORITY, 100)):
        scheduler = scripted_scheduler(enable_prefix_cache=False, completion_batch_size=2, prefill_batch_size=2,
                                       policy=policy)
        low = [Request(f"low{i}", list(range(10, 22 + i)), greedy(LONG), priority=100) for i in range(2)]
        urgent = Request("urgent", list(range(30, 44)), greedy(4), priority=urgent_priority)

        outputs = _run_stepped(scheduler, low, urgent)

        assert _first_token_step(outputs, "urgent") > min(_last_step(outputs, r.request_id) for r in low)
        assert scheduler.counters.num_preemptions == 0
