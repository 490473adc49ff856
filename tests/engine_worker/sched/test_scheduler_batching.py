"""Continuous batching: requests join and leave at any step, and greedy outputs match solo runs."""

from __future__ import annotations

from engine_worker.common.config import SchedulerConfig
from engine_worker.common.request import Request
from engine_worker.sched.scheduler import Scheduler, SchedulerOutput
from tests.engine_worker.engine_helpers import final, greedy, prompt_ids, run_scheduler, solo_tokens
from tests.engine_worker.fake_runner import scripted_scheduler


def _mixed_workload(tokenizer):
    # Different prompt lengths (3..90 tokens) and output lengths (4..40), arriving at different steps.
    lengths = [3, 17, 40, 8, 90, 25, 5, 60, 33, 12]
    max_tokens = [12, 4, 30, 40, 9, 22, 35, 16, 6, 27]
    prompts = [prompt_ids(tokenizer, n, seed_text=f"class C{i}:\n    pass\n") for i, n in enumerate(lengths)]
    arrival_steps = [0, 0, 1, 3, 3, 4, 9, 15, 16, 30]
    return prompts, max_tokens, arrival_steps


def test_mixed_batch_of_ten_greedy_requests_matches_each_solo_mlx_lm_run(tiny_model):
    model, tokenizer = tiny_model
    prompts, max_tokens, steps = _mixed_workload(tokenizer)
    expected = [solo_tokens(model, tokenizer, p, n) for p, n in zip(prompts, max_tokens, strict=True)]

    arrivals: dict[int, list[Request]] = {}
    for i, (p, n, s) in enumerate(zip(prompts, max_tokens, steps, strict=True)):
        arrivals.setdefault(s, []).append(Request(f"r{i}", p, greedy(n)))
    scheduler = Scheduler(model, tokenizer, SchedulerConfig(prefill_batch_size=4))
    max_running = []
    outputs = run_scheduler(scheduler, arrivals, on_step=lambda k, o: max_running.append(scheduler.get_num_running()))

    for i, want in enumerate(expected):
        got = final(outputs[f"r{i}"])
        assert got.output_token_ids == want, f"request r{i} diverged from its solo run"
        streamed = [t for o in outputs[f"r{i}"] for t in o.new_token_ids]
        assert streamed == want
    # Requests really overlapped (joined a running batch), and all of them left it.
    assert max(max_running) >= 5
    assert scheduler.get_num_running() == 0 and not scheduler.has_requests()


def test_finished_request_leaves_while_others_continue():
    scheduler = scripted_scheduler()  # scheduling alone: the scripted runner
    scheduler.add_request(Request("short", list(range(10, 20)), greedy(3, ignore_eos=True)))
    scheduler.add_request(Request("long", list(range(10, 22)), greedy(20, ignore_eos=True)))
    finished_at: dict[str, int] = {}
    step = 0
    while scheduler.has_requests():
        out: SchedulerOutput = scheduler.step()
        for rid in out.finished_request_ids:
            finished_at[rid] = step
        step += 1
    assert finished_at["short"] < finished_at["long"]
    assert scheduler.get_request("short").num_output_tokens == 3
    assert scheduler.get_request("long").num_output_tokens == 20


def test_step_output_reports_scheduled_requests_and_prefilled_tokens():
    scheduler = scripted_scheduler()  # scheduling alone: the scripted runner
    scheduler.add_request(Request("a", list(range(10, 17)), greedy(2)))
    scheduler.add_request(Request("b", list(range(20, 31)), greedy(2)))
    out = scheduler.step()
    assert out.scheduled_request_ids == ["a", "b"]
    assert out.num_scheduled_tokens == 18
    assert out.has_work
    run_scheduler(scheduler)
    assert not scheduler.step().has_work
