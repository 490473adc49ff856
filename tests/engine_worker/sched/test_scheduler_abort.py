"""Abort: waiting requests never run, running ones leave the batch, the others are unaffected."""

from __future__ import annotations

from engine_worker.common.config import SchedulerConfig
from engine_worker.common.request import Request, RequestStatus
from engine_worker.sched.scheduler import Scheduler
from tests.engine_worker.engine_helpers import final, greedy, prompt_ids, run_scheduler, solo_tokens
from tests.engine_worker.fake_runner import scripted_scheduler


def test_abort_of_waiting_request_never_runs():
    scheduler = scripted_scheduler(max_num_seqs=1)  # scheduling alone: the scripted runner
    scheduler.add_request(Request("busy", list(range(10, 16)), greedy(5, ignore_eos=True)))
    scheduler.add_request(Request("victim", list(range(20, 26)), greedy(5, ignore_eos=True)))
    scheduler.step()
    assert scheduler.get_request("victim").status == RequestStatus.WAITING
    assert scheduler.abort_request("victim") is True
    assert scheduler.get_num_waiting() == 0
    outputs = run_scheduler(scheduler)
    victim = outputs["victim"]
    assert len(victim) == 1 and victim[0].finished and victim[0].finish_reason == "abort"
    assert victim[0].output_token_ids == []
    request = scheduler.get_request("victim")
    assert request.status == RequestStatus.FINISHED_ABORTED and request.batch_uid is None
    assert scheduler.counters.num_requests_aborted == 1
    assert scheduler.abort_request("victim") is False  # already finished


def test_abort_of_running_request_leaves_batch_before_next_step_and_others_match_solo(tiny_model):
    model, tokenizer = tiny_model
    prompts = {f"r{i}": prompt_ids(tokenizer, 6 + 5 * i, seed_text=f"x{i} = {i}\n") for i in range(4)}
    scheduler = Scheduler(model, tokenizer)
    for rid, p in prompts.items():
        scheduler.add_request(Request(rid, p, greedy(16)))
    outputs: dict[str, list] = {}
    while scheduler.get_request("r2").num_output_tokens < 3:
        for o in scheduler.step().outputs:
            outputs.setdefault(o.request_id, []).append(o)
    assert scheduler.abort_request("r2")
    tokens_at_abort = scheduler.get_request("r2").num_output_tokens
    assert "r2" not in scheduler.running
    rest = run_scheduler(scheduler)
    assert scheduler.get_request("r2").num_output_tokens == tokens_at_abort
    assert [o.finish_reason for o in rest["r2"]] == ["abort"]
    assert rest["r2"][0].completion_tokens == tokens_at_abort
    for rid in ("r0", "r1", "r3"):
        got = outputs.get(rid, []) + rest[rid]
        assert final(got).output_token_ids == solo_tokens(model, tokenizer, prompts[rid], 16)


def test_abort_of_unknown_request_is_refused():
    assert scripted_scheduler().abort_request("nope") is False


def test_abort_during_a_shared_chunked_prefill_leaves_the_co_prefilled_requests_intact(tiny_model):
    # Seed defect 8: aborting one request of a multi-prompt partial prefill dropped the whole
    # partial batch, leaving its neighbours "running" forever.
    model, tokenizer = tiny_model
    prompts = {f"p{i}": prompt_ids(tokenizer, 150 + 20 * i, seed_text=f"y{i} = [{i}]\n") for i in range(3)}
    scheduler = Scheduler(model, tokenizer, SchedulerConfig(chunked_prefill_tokens=32))
    for rid, p in prompts.items():
        scheduler.add_request(Request(rid, p, greedy(6)))
    for _ in range(2):  # two chunks of 32 tokens into each prompt: all three are mid-prefill
        assert not scheduler.step().outputs
    assert all(scheduler.get_request(r).num_output_tokens == 0 for r in prompts)
    assert scheduler.abort_request("p1")
    rest = run_scheduler(scheduler, max_steps=200)
    for rid in ("p0", "p2"):
        assert final(rest[rid]).output_token_ids == solo_tokens(model, tokenizer, prompts[rid], 6)
    assert [o.finish_reason for o in rest["p1"]] == ["abort"]
