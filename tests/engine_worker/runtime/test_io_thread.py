"""The worker's I/O thread between engine steps: what wakes it while it folds plain deltas."""

from __future__ import annotations

import time

from engine_worker.common.request import RequestOutput
from engine_worker.protocol import JobSpec, Submit
from engine_worker.runtime.io_thread import IOThread
from engine_worker.runtime.sink import MemorySink


def _submit(job_id: str, prompt_tokens: int) -> Submit[JobSpec]:
    """The I/O thread's command to follow a job of ``prompt_tokens`` prompt tokens."""
    return Submit(JobSpec(job_id, tuple(range(prompt_tokens)), max_tokens=64))


def _token(job_id: str, n: int) -> list[RequestOutput]:
    return [RequestOutput(job_id, new_token_ids=[7], new_text="a", completion_tokens=n)]


def test_plain_deltas_do_not_wake_the_io_thread_during_the_interval_but_a_first_token_does():
    sink = MemorySink()
    io = IOThread(sink, on_finished=lambda job_id: None, interval_s=2.0)
    checks: list[int] = []
    urgent = io._urgent

    def counting_urgent(items: list[object]) -> bool:
        checks.append(len(items))
        return urgent(items)

    io._urgent = counting_urgent  # type: ignore[method-assign]
    io.start()
    io.put(_submit("steady", 3))
    io.on_outputs(_token("steady", 1))  # its first token: published at once
    deadline = time.monotonic() + 5
    while not any(b.first_tokens for b in sink.batches):
        assert time.monotonic() < deadline
        time.sleep(0.005)
    checks.clear()
    for n in range(2, 42):  # 40 plain steps, ~3 ms apart, well inside one 2 s interval
        io.on_outputs(_token("steady", n))
        time.sleep(0.003)
    # The thread looked at what had arrived when the first plain step came and not again: the
    # engine thread kept the GIL for its steps.
    assert len(checks) <= 2, f"woken {len(checks)} times by plain deltas"

    io.put(_submit("late", 3))
    started = time.monotonic()
    io.on_outputs(_token("late", 1))
    while not any(ft.job_id == "late" for b in sink.batches for ft in b.first_tokens):
        assert time.monotonic() - started < 0.3, "the late job's first token waited for the interval"
        time.sleep(0.002)
    io.stop(5)
    steady = "".join(c.text for b in sink.batches for c in b.chunks if c.job_id == "steady")
    assert steady == "a" * 41  # every plain delta was published, folded


def test_a_first_token_without_text_keeps_its_job_urgent_until_its_first_text_goes_out():
    # A character split over two tokens: the first brings no text. Its client has seen nothing,
    # so the second token's text must not wait for the (here 2 s) interval.
    sink = MemorySink()
    io = IOThread(sink, on_finished=lambda job_id: None, interval_s=2.0)
    io.start()
    io.put(_submit("split", 3))
    io.on_outputs([RequestOutput("split", new_token_ids=[0xE4], new_text="", completion_tokens=1)])
    deadline = time.monotonic() + 5
    while not any(b.first_tokens for b in sink.batches):
        assert time.monotonic() < deadline
        time.sleep(0.002)
    started = time.monotonic()
    io.on_outputs([RequestOutput("split", new_token_ids=[0xB8], new_text="中", completion_tokens=2)])
    while not any(c.text == "中" for b in sink.batches for c in b.chunks):
        assert time.monotonic() - started < 1.0, "the first text waited for the interval"
        time.sleep(0.002)
    # Once the client has text, plain deltas fold again for the interval.
    io.on_outputs(_token("split", 3))
    time.sleep(0.2)
    assert not any(c.text == "a" for b in sink.batches for c in b.chunks)
    io.stop(5)
    assert "".join(c.text for b in sink.batches for c in b.chunks) == "中a"
