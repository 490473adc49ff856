"""Scheduling policy against a scripted generator: no model needed."""

from __future__ import annotations

from engine_worker.common.request import Request, SamplingParams
from tests.engine_worker.engine_helpers import final, run_scheduler
from tests.engine_worker.fake_runner import ScriptedRunner, scripted_scheduler


def sp(n):
    return SamplingParams(max_tokens=n, temperature=0.0)


def test_scripted_tokens_flow_into_outputs_text_and_usage():
    scheduler = scripted_scheduler()
    out = final(run_scheduler(scheduler, {0: [Request("a", "hello", sp(3))]})["a"])
    assert out.output_token_ids == [101, 102, 103]
    assert out.output_text == "<101><102><103>"
    assert out.usage == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8, "cached_tokens": 0}
    assert scheduler.get_stats()["num_requests_processed"] == 1


def test_a_generator_step_failing_with_a_bug_fails_the_batch_with_errors_and_the_queue_keeps_going():
    scheduler = scripted_scheduler(max_num_seqs=2)
    for rid in ("a", "b", "c"):
        scheduler.add_request(Request(rid, "xyz", sp(5)))
    scheduler.step()
    first = ScriptedRunner.instances[0]
    first.fail_next = TypeError("'NoneType' object is not subscriptable")
    out = scheduler.step()
    errors = {o.request_id: o for o in out.outputs if o.finish_reason == "error"}
    assert set(errors) == {"a", "b"} and all(o.error for o in errors.values())
    assert first.closed and scheduler.counters.num_step_errors == 1
    rest = run_scheduler(scheduler)
    assert final(rest["c"]).finish_reason == "length"  # served by a fresh generator
    assert len(ScriptedRunner.instances) == 2


def test_phase_and_rows_follow_requests_through_their_life():
    scheduler = scripted_scheduler(max_num_seqs=1)
    scheduler.add_request(Request("a", "abc", sp(3)))
    scheduler.add_request(Request("b", "de", sp(3)))
    rows = scheduler.get_running_requests_info()
    assert [(r["request_id"], r["status"], r["phase"]) for r in rows] == [
        ("a", "waiting", "queued"), ("b", "waiting", "queued")]
    scheduler.step()
    rows = {r["request_id"]: r for r in scheduler.get_running_requests_info()}
    assert rows["a"]["status"] == "running" and rows["a"]["phase"] == "prefill"
    scheduler.step()
    rows = {r["request_id"]: r for r in scheduler.get_running_requests_info()}
    assert rows["a"]["status"] == "running" and rows["a"]["phase"] == "generation"
    assert rows["b"]["status"] == "waiting"
