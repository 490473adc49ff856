"""JobHost on the real tiny model: streaming, coalescing, cancel, drain, heartbeat."""

from __future__ import annotations

import threading
import time

import pytest

from engine_worker.common.config import EngineConfig, SchedulerConfig
from engine_worker.common.request import SamplingParams
from engine_worker.engine_core import EngineCore
from engine_worker.protocol import JobSpec, StepBatch
from engine_worker.runtime import JobHost, MemorySink
from engine_worker.runtime.convert import spec_to_request

PROMPTS = ["The quick brown fox", "Once upon a time", "def main():", "In the beginning"]


@pytest.fixture
def engine(tiny_model):
    model, tokenizer = tiny_model
    core = EngineCore(model, tokenizer, EngineConfig(scheduler_config=SchedulerConfig(enable_prefix_cache=False)))
    core.start()
    yield core
    core.stop()
    core.close()


def make_host(engine, sink) -> JobHost:
    host = JobHost(engine, sink, model_name="tiny", context_length=4096)
    host.start()
    return host


def spec(tokenizer, job_id: str, prompt: str, max_tokens: int = 24, **kw) -> JobSpec:
    return JobSpec(job_id=job_id, prompt_token_ids=tuple(tokenizer.encode(prompt)), max_tokens=max_tokens,
                   ignore_eos=True, **kw)


def test_concurrent_jobs_stream_numbered_chunks_whose_text_is_the_final_text(engine, tiny_model):
    _, tokenizer = tiny_model
    sink = MemorySink()
    host = make_host(engine, sink)
    for i, prompt in enumerate(PROMPTS):
        assert host.submit(spec(tokenizer, f"job-{i}", prompt))
    finals = [sink.wait_final(f"job-{i}", 60) for i in range(len(PROMPTS))]
    host.stop()
    alone = engine.generate_batch_sync(
        [tokenizer.encode(p) for p in PROMPTS], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    )
    for i, final in enumerate(finals):
        chunks = sink.chunks(f"job-{i}")
        assert [c.seq for c in chunks] == list(range(1, len(chunks) + 1))
        assert "".join(c.text for c in chunks) == final.text == alone[i].output_text
        assert (final.finish_reason, final.completion_tokens, final.last_seq) == ("length", 24, len(chunks))
        assert final.prompt_tokens == len(tokenizer.encode(PROMPTS[i]))
        assert final.first_token_at is not None and final.finished_at >= final.first_token_at
    assert not host.held_jobs()


class SlowSink(MemorySink):
    """A sink that takes 300 ms per write: slower than an engine step even on a loaded machine."""

    def publish(self, batch: StepBatch) -> None:
        time.sleep(0.3)
        super().publish(batch)


def test_a_slow_sink_gets_one_chunk_per_job_per_batch_and_never_one_per_token(engine, tiny_model):
    _, tokenizer = tiny_model
    sink = SlowSink()
    host = make_host(engine, sink)
    for i, prompt in enumerate(PROMPTS):
        host.submit(spec(tokenizer, f"s-{i}", prompt, max_tokens=64))
    finals = [sink.wait_final(f"s-{i}", 60) for i in range(len(PROMPTS))]
    host.stop()
    for batch in sink.batches:
        ids = [c.job_id for c in batch.chunks]
        assert len(ids) == len(set(ids)), "two chunks of one job in one batch"
    for i, final in enumerate(finals):
        chunks = sink.chunks(f"s-{i}")
        assert "".join(c.text for c in chunks) == final.text
        # The engine ran ahead of the slow sink, so steps were folded: fewer writes than tokens.
        assert len(chunks) < final.completion_tokens


def test_cancel_of_a_running_job_ends_it_within_a_second_with_the_streamed_text(engine, tiny_model):
    _, tokenizer = tiny_model
    sink = MemorySink()
    host = make_host(engine, sink)
    host.submit(spec(tokenizer, "long", "Once upon a time", max_tokens=3000))
    deadline = time.monotonic() + 30
    while not sink.chunks("long"):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    started = time.monotonic()
    assert host.cancel("long")
    final = sink.wait_final("long", 1.0)
    assert final is not None and time.monotonic() - started < 1.0
    assert final.finish_reason == "abort"
    assert final.text == "".join(c.text for c in sink.chunks("long"))
    assert final.completion_tokens < 3000
    deadline = time.monotonic() + 5
    while engine.get_stats()["num_running"]:  # the engine dropped it too
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert not host.cancel("long")
    host.stop()


def test_a_duplicate_submit_is_ignored_and_the_first_run_is_untouched(engine, tiny_model):
    _, tokenizer = tiny_model
    sink = MemorySink()
    host = make_host(engine, sink)
    assert host.submit(spec(tokenizer, "dup", "Once upon a time"))
    assert not host.submit(spec(tokenizer, "dup", "Once upon a time"))
    final = sink.wait_final("dup", 60)
    assert final.completion_tokens == 24
    assert sum(1 for b in sink.batches for f in b.finals if f.job_id == "dup") == 1
    host.stop()


def test_drain_waits_for_short_jobs_and_hands_back_long_ones_without_a_final(engine, tiny_model):
    _, tokenizer = tiny_model
    sink = MemorySink()
    host = make_host(engine, sink)
    host.submit(spec(tokenizer, "short", "The quick brown fox", max_tokens=8))
    host.submit(spec(tokenizer, "endless", "Once upon a time", max_tokens=3000))
    remaining = host.drain(timeout=3.0)
    assert remaining == ["endless"]
    assert sink.final("short") is not None
    assert not host.submit(spec(tokenizer, "late", "def main():"))  # draining admits nothing
    assert host.hand_back(remaining) == ["endless"]
    host.stop()
    assert sink.final("endless") is None
    assert host.held_jobs() == []


def test_heartbeat_reports_identity_memory_and_running_requests(engine, tiny_model):
    _, tokenizer = tiny_model
    sink = MemorySink()
    host = make_host(engine, sink)
    host.submit(spec(tokenizer, "hb", "Once upon a time", max_tokens=3000))
    deadline = time.monotonic() + 30
    while not sink.chunks("hb"):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    beat = host.heartbeat("worker-1")
    assert (beat.worker_id, beat.model, beat.device, beat.context_length) == ("worker-1", "tiny", "cpu", 4096)
    assert beat.num_running == 1
    assert beat.memory.active_bytes > 0 and beat.memory.peak_bytes >= beat.memory.active_bytes
    assert [row["request_id"] for row in beat.requests] == ["hb"]
    host.cancel("hb")
    assert sink.wait_final("hb", 5) is not None
    host.stop()


def test_outputs_keep_flowing_while_another_thread_submits_and_cancels(engine, tiny_model):
    _, tokenizer = tiny_model
    sink = MemorySink()
    host = make_host(engine, sink)
    errors: list[BaseException] = []

    def churn() -> None:
        try:
            for i in range(6):
                host.submit(spec(tokenizer, f"c-{i}", PROMPTS[i % 4], max_tokens=16))
                if i % 2:
                    host.cancel(f"c-{i}")
        except BaseException as exc:  # surfaced by the assert below
            errors.append(exc)

    thread = threading.Thread(target=churn)
    thread.start()
    thread.join()
    assert not errors
    assert host.wait_idle(60)
    reasons = {f"c-{i}": sink.final(f"c-{i}").finish_reason for i in range(6)}
    assert all(reasons[f"c-{i}"] == "length" for i in (0, 2, 4))
    host.stop()


class TimedSink(MemorySink):
    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def publish(self, batch: StepBatch) -> None:
        self.times.append(time.monotonic())
        super().publish(batch)


def test_stream_interval_folds_deltas_but_never_delays_first_tokens_or_finals(engine, tiny_model):
    _, tokenizer = tiny_model
    sink = TimedSink()
    host = JobHost(engine, sink, stream_interval_s=0.3)
    host.start()
    for i, prompt in enumerate(PROMPTS):
        host.submit(spec(tokenizer, f"i-{i}", prompt, max_tokens=48))
    finals = [sink.wait_final(f"i-{i}", 60) for i in range(len(PROMPTS))]
    host.stop()
    for i, final in enumerate(finals):
        assert "".join(c.text for c in sink.chunks(f"i-{i}")) == final.text
    for previous, now, batch in zip(sink.times, sink.times[1:], sink.batches[1:], strict=False):
        ordinary = not (batch.first_tokens or batch.finals)
        if ordinary:
            assert now - previous >= 0.29, "a plain delta batch came sooner than the interval"
    first_batch_of = {ft.job_id: n for n, b in enumerate(sink.batches) for ft in b.first_tokens}
    assert set(first_batch_of) == {f"i-{i}" for i in range(len(PROMPTS))}


def test_a_job_admitted_while_others_wait_out_the_interval_gets_its_first_token_at_once(engine, tiny_model):
    """The I/O thread holds plain deltas for ``stream_interval_s``; a first token that arrives
    meanwhile ends the wait (it used to sit out the rest of the interval: TTFT + up to 1 s here)."""
    _, tokenizer = tiny_model
    sink = TimedSink()
    host = JobHost(engine, sink, stream_interval_s=1.0)
    host.start()
    host.submit(spec(tokenizer, "early", PROMPTS[0], max_tokens=400))
    deadline = time.monotonic() + 30
    while not any(ft.job_id == "early" for b in sink.batches for ft in b.first_tokens):
        assert time.monotonic() < deadline
        time.sleep(0.005)
    time.sleep(0.1)  # "early" keeps decoding: its deltas are now being held for the interval
    submitted = time.monotonic()
    host.submit(spec(tokenizer, "late", PROMPTS[1], max_tokens=4))
    final = sink.wait_final("late", 30)
    published = next(t for t, b in zip(sink.times, sink.batches, strict=True)
                     if any(ft.job_id == "late" for ft in b.first_tokens))
    host.cancel("early")
    host.stop()
    assert final is not None and final.completion_tokens == 4
    assert published - submitted < 0.4, f"the first token waited {published - submitted:.3f} s for the interval"


def test_jobs_of_an_engine_that_dies_get_no_final_and_are_handed_back_at_once(engine, tiny_model):
    _, tokenizer = tiny_model
    sink = MemorySink()
    host = make_host(engine, sink)
    real_step = engine.scheduler.step
    steps = []

    def failing_step(*args, **kwargs):
        steps.append(1)
        if len(steps) > 3:  # a few tokens in, the engine itself breaks (not the request)
            raise MemoryError("device out of memory")
        return real_step(*args, **kwargs)

    engine.scheduler.step = failing_step
    assert host.submit(spec(tokenizer, "doomed", PROMPTS[0], max_tokens=200))
    deadline = time.time() + 30
    while engine.is_running() and time.time() < deadline:
        time.sleep(0.02)
    assert not engine.is_running()
    host.flush()
    started = time.monotonic()
    remaining = host.drain(timeout=20)
    assert remaining == ["doomed"] and time.monotonic() - started < 5
    assert sink.final("doomed") is None  # not reported as failed: it goes back to the queue
    assert host.hand_back(remaining) == ["doomed"]
    host.stop()


def test_a_job_that_runs_again_numbers_its_chunks_on_from_its_first_seq(engine, tiny_model):
    # A job's new attempt goes on after the seqs of its earlier one (api/worker/admission.py).
    _, tokenizer = tiny_model
    sink = MemorySink()
    host = make_host(engine, sink)
    assert host.submit(spec(tokenizer, "again", PROMPTS[0], max_tokens=8, first_seq=12))
    final = sink.wait_final("again", 60)
    host.stop()

    seqs = [c.seq for c in sink.chunks("again")]
    assert seqs == list(range(12, 12 + len(seqs))) and seqs
    assert final.last_seq == seqs[-1]
    assert final.text == "".join(c.text for c in sink.chunks("again"))


def test_the_periodic_duties_run_on_the_io_thread_while_idle_and_between_batches(engine, tiny_model):
    _, tokenizer = tiny_model
    sink = MemorySink()
    ticks: list[str] = []
    host = JobHost(engine, sink, on_tick=lambda: ticks.append(threading.current_thread().name), tick_s=0.05)
    host.start()
    time.sleep(0.3)
    idle_ticks = len(ticks)
    assert host.submit(spec(tokenizer, "t", PROMPTS[1], max_tokens=8))
    sink.wait_final("t", 60)
    host.stop()

    assert idle_ticks >= 3  # nothing to write, and the duties still ran
    assert len(ticks) > idle_ticks and set(ticks) == {"engine-io"}


def test_prefix_cache_entries_and_hit_rate_reach_the_heartbeat_and_an_evicted_entry_leaves_it(tiny_model):
    model, tokenizer = tiny_model
    core = EngineCore(model, tokenizer, EngineConfig())  # the default memory-aware prefix cache
    core.start()
    sink = MemorySink()
    host = make_host(core, sink)
    try:
        prefix = "You are a careful assistant who writes small Python functions. " * 3
        for i, suffix in enumerate(["def add(a, b):", "class Stack:", "import os"]):
            host.submit(spec(tokenizer, f"shared-{i}", prefix + suffix, max_tokens=8))
            assert sink.wait_final(f"shared-{i}", 60) is not None
        beat = host.heartbeat("w")
        assert beat.cache["hits"] >= 2 and beat.cache["hit_rate"] > 0.5
        assert len(beat.cache_entries) == beat.cache["entries"] >= 2
        assert beat.generated_tokens >= 24
        assert beat.capacity == core.scheduler.config.max_running  # what routing counts as room
        victim = beat.cache_entries[0]
        assert {"key_hash", "tokens", "bytes", "tier", "hit_count", "last_used"} <= set(victim)

        assert host.evict_cache_entry(victim["key_hash"])

        after = host.heartbeat("w")
        assert victim["key_hash"] not in [row["key_hash"] for row in after.cache_entries]
        assert after.cache["entries"] == beat.cache["entries"] - 1
        assert not host.evict_cache_entry(victim["key_hash"])  # gone already
    finally:
        host.stop()
        core.stop()
        core.close()


def test_a_hand_over_of_many_jobs_admits_them_in_one_step_and_refuses_a_bad_one_alone(engine, tiny_model):
    _, tokenizer = tiny_model
    sink = MemorySink()
    refused: list[tuple[str, bool]] = []
    host = JobHost(engine, sink, on_refused=lambda job_id, error, job_fault: refused.append((job_id, job_fault)))
    host.start()
    steps: list[set[str]] = []
    engine.add_output_listener(lambda outputs: steps.append({out.request_id for out in outputs}))
    specs = [spec(tokenizer, f"m-{i}", PROMPTS[i], max_tokens=4) for i in range(4)]
    bad = spec(tokenizer, "bad", PROMPTS[0], max_tokens=4)
    engine.submit(spec_to_request(bad))  # live in the engine already: the hand-over's copy is refused

    assert host.submit_many([*specs[:2], bad, *specs[2:]]) == [s.job_id for s in specs]

    assert all(sink.wait_final(s.job_id, 60) is not None for s in specs)
    assert refused == [("bad", True)] and "bad" not in host.held_jobs()
    # One hand-over: the engine's first step that ran any of the four prefilled all four.
    ids = {s.job_id for s in specs}
    assert ids <= next(step for step in steps if step & ids)
    host.stop()
