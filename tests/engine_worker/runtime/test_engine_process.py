"""EngineProcess: the engine in a spawned child, driven over one connection, on the real tiny model."""

from __future__ import annotations

import os
import pickle
import signal
import time

import pytest

from engine_worker.common.errors import EngineClosed, InvalidRequest
from engine_worker.protocol import (
    Admit,
    Evict,
    FinalResult,
    FirstToken,
    JobSpec,
    OutputChunk,
    Refused,
    StepBatch,
)
from engine_worker.runtime import ChildSpec, EngineChild, EngineProcess, MemorySink
from engine_worker.runtime.engine_process import _obey
from engine_worker.runtime.engine_side import EngineSide

PROMPT = (1, 40, 41, 42, 43)


@pytest.fixture
def started(tiny_model_path):
    """An EngineProcess on the tiny model with its sink, ticks and refusals recorded."""
    sink = MemorySink()
    ticks: list[float] = []
    refused: list[tuple[str, str, bool]] = []
    host = EngineProcess(ChildSpec(worker_id="w-proc", model_path=str(tiny_model_path), stream_interval_s=0.0,
                                   heartbeat_s=0.2),
                         sink, on_tick=lambda: ticks.append(time.monotonic()),
                         on_refused=lambda *args: refused.append(args), tick_s=0.05)
    host.start()
    yield host, sink, ticks, refused
    if host.engine_running():
        host.stop()


def test_a_child_spawned_beforehand_is_the_engine_the_host_starts_with(tiny_model_path):
    """A worker spawns its engine process before its own set-up (api/worker/early_engine.py): the
    host then waits for that child's heartbeat instead of spawning a second one."""
    child_spec = ChildSpec(worker_id="w-early", model_path=str(tiny_model_path), stream_interval_s=0.0,
                           heartbeat_s=0.2)
    child = EngineChild(child_spec)
    host = EngineProcess(child_spec, MemorySink(), child=child)
    host.start()
    try:
        assert host._proc is child.proc and host.heartbeat("w-early").worker_id == "w-early"
    finally:
        host.stop()


def test_a_child_spawned_with_another_spec_is_refused():
    spawned = ChildSpec(worker_id="a", model_path="-", stream_interval_s=0, heartbeat_s=1)

    class Spawned:  # EngineChild's fields, without a process
        spec = spawned

    with pytest.raises(ValueError, match="another spec"):
        EngineProcess(ChildSpec(worker_id="b", model_path="-", stream_interval_s=0, heartbeat_s=1), MemorySink(),
                      child=Spawned())  # type: ignore[arg-type]


def spec(job_id: str, max_tokens: int = 12, **kw) -> JobSpec:
    return JobSpec(job_id=job_id, prompt_token_ids=PROMPT, max_tokens=max_tokens, ignore_eos=True, **kw)


def test_jobs_stream_from_the_child_and_their_text_is_the_final_text(started):
    host, sink, ticks, _ = started
    assert host.heartbeat("w-proc").model == "tiny" and host.heartbeat("w-proc").worker_id == "w-proc"
    for job_id in ("a", "b", "c"):
        assert host.submit(spec(job_id, first_seq=5 if job_id == "c" else 1))
    assert not host.submit(spec("a"))  # held already
    finals = {job_id: sink.wait_final(job_id, 60) for job_id in ("a", "b", "c")}

    for job_id, final in finals.items():
        assert final is not None and final.completion_tokens == 12 and final.finish_reason == "length"
        chunks = sink.chunks(job_id)
        assert "".join(c.text for c in chunks) == final.text
    assert [c.seq for c in sink.chunks("c")][0] == 5
    assert wait_until(lambda: host.held_jobs() == [])  # released as their finals were written
    idle = len(ticks)
    time.sleep(0.5)
    assert len(ticks) >= idle + 3  # the parent's duties run on its I/O thread, messages or not


def test_cancel_ends_a_job_with_abort_and_hand_back_releases_one_without_a_final(started):
    host, sink, _, _ = started
    assert host.submit(spec("long", max_tokens=2000)) and host.submit(spec("back", max_tokens=2000))
    assert wait_until(lambda: sink.chunks("long") and sink.chunks("back"))

    assert host.cancel("long")
    assert host.hand_back(["back"]) == ["back"]

    assert sink.wait_final("long", 60).finish_reason == "abort"
    time.sleep(0.5)
    assert sink.final("back") is None and host.held_jobs() == []
    assert not host.cancel("back")


def test_a_job_that_cannot_run_fails_alone_with_an_error_final(started):
    host, sink, _, _ = started
    too_long = tuple(range(10, 10 + 5000))  # the tiny model's context is 4096 tokens
    assert host.submit(JobSpec(job_id="bad", prompt_token_ids=too_long, max_tokens=4))
    assert host.submit(spec("fine", max_tokens=4))
    bad, fine = sink.wait_final("bad", 60), sink.wait_final("fine", 60)
    assert bad.finish_reason == "error" and bad.error and fine.finish_reason == "length"


class RefusingEngine:
    """The part of EngineCore an EngineSide drives, refusing every request with ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def add_output_listener(self, fn) -> None:
        pass

    def submit_many(self, requests) -> list:
        return [self.error for _ in requests]


@pytest.mark.parametrize(("error", "job_fault"), [(InvalidRequest("bad"), True), (ValueError("bad"), True),
                                                   (EngineClosed("down"), False)])
def test_a_submit_the_engine_refuses_is_sent_back_as_the_jobs_fault_or_the_engines(error, job_fault):
    sent: list[object] = []
    _obey(EngineSide(RefusingEngine(error), MemorySink(), on_refused=sent.append), Admit((spec("x"),)))
    assert sent == [Refused("x", str(error), job_fault=job_fault)]


def test_a_refusal_releases_the_job_and_reaches_the_worker():
    refused: list[tuple] = []
    host = EngineProcess(ChildSpec(worker_id="w", model_path="-", stream_interval_s=0, heartbeat_s=1), MemorySink(),
                         on_refused=lambda *args: refused.append(args))
    host._held["x"] = 0.0
    host._handle(Refused("x", "no", job_fault=False))
    assert refused == [("x", "no", False)] and host.held_jobs() == []


def test_outputs_of_a_job_handed_back_still_in_the_connection_are_not_written():
    """The child sent them before it read the HandBack; the job's next attempt, perhaps on another
    worker, has restarted its stream by the time they arrive, and must not see them."""
    sink = MemorySink()
    host = EngineProcess(ChildSpec(worker_id="w", model_path="-", stream_interval_s=0, heartbeat_s=1), sink)
    host._held["kept"] = 0.0  # "back" was handed back
    host._handle(StepBatch(chunks=(OutputChunk("kept", 3, "a", 3), OutputChunk("back", 7, "b", 7)),
                           finals=(FinalResult("back", "xyb", "length", 4, 7),),
                           first_tokens=(FirstToken("back", 1.0),)))
    host._handle(StepBatch(chunks=(OutputChunk("back", 8, "c", 8),)))

    assert [c.text for c in sink.chunks("kept")] == ["a"]
    assert sink.chunks("back") == [] and sink.final("back") is None


class EvictingHost:
    def __init__(self) -> None:
        self.evicted: list[str] = []

    def evict_cache_entry(self, key: str) -> bool:
        self.evicted.append(key)
        return True


def test_an_evict_message_crosses_the_connection_and_reaches_the_childs_host():
    message = pickle.loads(pickle.dumps(Evict("07c1c96c835529d3562b0677")))
    host = EvictingHost()
    _obey(host, message)
    assert host.evicted == ["07c1c96c835529d3562b0677"]


def test_an_evicted_prefix_cache_entry_leaves_the_childs_next_heartbeat(started):
    host, sink, _, _ = started
    for job_id, tail in (("first", (50, 51)), ("second", (60, 61))):
        assert host.submit(JobSpec(job_id=job_id, prompt_token_ids=PROMPT * 8 + tail, max_tokens=4, ignore_eos=True))
        assert sink.wait_final(job_id, 60) is not None
    assert wait_until(lambda: len(host.heartbeat("w-proc").cache_entries) >= 2)
    beat = host.heartbeat("w-proc")
    assert beat.cache["hits"] >= 1 and beat.generated_tokens >= 8
    key = beat.cache_entries[0]["key_hash"]

    assert host.evict_cache_entry(key)

    assert wait_until(lambda: key not in [row["key_hash"] for row in host.heartbeat("w-proc").cache_entries],
                      timeout=5)


def test_drain_waits_for_running_jobs_and_stop_ends_the_child(started):
    host, sink, _, _ = started
    assert host.submit(spec("short", max_tokens=8))
    assert host.drain(60) == []
    assert sink.final("short") is not None
    assert not host.submit(spec("late"))  # draining: no new job
    host.stop()
    assert not host.engine_running() and host._proc.exitcode == 0


def test_a_child_that_dies_turns_the_engine_off_for_the_worker(started):
    host, _, ticks, _ = started
    assert host.submit(spec("doomed", max_tokens=5000))
    os.kill(host._proc.pid, signal.SIGKILL)
    assert wait_until(lambda: not host.engine_running())
    assert host.drain(5) == ["doomed"]  # nothing finishes it: the worker hands it back


def wait_until(condition, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False
