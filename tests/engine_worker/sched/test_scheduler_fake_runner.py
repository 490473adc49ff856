"""Scheduling policy against a scripted generator: no model needed."""

from __future__ import annotations

import pytest

from engine_worker.cache.protocol import PrefixCacheBackend
from engine_worker.common.config import SchedulerConfig
from engine_worker.common.request import Request, SamplingParams
from engine_worker.sched.scheduler import Scheduler
from tests.engine_worker.engine_helpers import final, run_scheduler
from tests.engine_worker.fake_runner import ScriptedRunner, Tok, scripted_scheduler


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


class _Layer:
    offset = 3  # what a finished sequence's KV holds


class _CachingRunner(ScriptedRunner):
    """Hands each finished sequence a cache, as mlx-lm's generator does."""

    def step(self):
        result = super().step()
        for r in result.generated:
            if r.finish_reason is not None:
                r.prompt_cache, r.all_tokens = [_Layer()], [1, 2, 3, 4]
        return result


class _RecordingCache(PrefixCacheBackend):
    """A back end that records what the scheduler asks of it, in order."""

    name = "recording"
    active = True

    def __init__(self):
        self.calls: list[tuple[str, object]] = []

    def fetch(self, tokens):
        return None, list(tokens), "miss"

    def store(self, tokens, cache_layers):
        self.calls.append(("store", list(tokens)))

    def store_many(self, items):
        self.calls.append(("store_many", len(items)))

    def release(self, request_id):
        self.calls.append(("release", request_id))

    def get_stats(self):
        return {}

    def clear(self):
        pass


def test_requests_finishing_in_one_step_are_stored_together_then_unpinned():
    cache = _RecordingCache()
    scheduler = Scheduler(object(), Tok(), SchedulerConfig(), prefix_cache=cache, runner_factory=_CachingRunner,
                          max_model_len=100)
    rids = [f"r{i}" for i in range(4)]
    for rid in rids:
        scheduler.add_request(Request(rid, "xyz", sp(1)))
    scheduler.step()  # their prompts
    cache.calls.clear()

    out = scheduler.step()  # their one token each

    assert out.finished_request_ids == set(rids)
    # Before: a store, then the request's release, once per request.
    assert cache.calls == [("store_many", 4), *(("release", rid) for rid in rids)]


class _BrokenLastToken(_CachingRunner):
    """The last sequence's token is one the tokenizer cannot read."""

    def step(self):
        result = super().step()
        if result.generated:
            result.generated[-1].token = 0
        return result


class _TokRefusingZero(Tok):
    class _Detok(Tok._Detok):
        def add_token(self, t):
            if t == 0:
                raise ValueError("no text for token 0")
            super().add_token(t)


def test_a_step_that_raises_still_stores_and_unpins_the_requests_it_finished():
    cache = _RecordingCache()
    scheduler = Scheduler(object(), _TokRefusingZero(), SchedulerConfig(), prefix_cache=cache,
                          runner_factory=_BrokenLastToken, max_model_len=100)
    for i in range(4):
        scheduler.add_request(Request(f"r{i}", "xyz", sp(1)))
    scheduler.step()
    cache.calls.clear()

    with pytest.raises(ValueError):
        scheduler.step()

    # Nothing of theirs waits for a later step: r0-r2 finished before r3's token raised.
    assert cache.calls == [("store_many", 3), *(("release", f"r{i}") for i in range(3))]
