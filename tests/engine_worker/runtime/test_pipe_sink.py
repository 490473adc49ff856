"""PipeSink: the worker's output batches published by a child process, in order, none lost on an
orderly stop, a signal to the process group, or the parent's death."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from engine_worker.protocol import FinalResult, OutputChunk, StepBatch
from engine_worker.runtime.pipe_sink import PipeSink
from engine_worker.runtime.sink import SinkError

ROOT = Path(__file__).resolve().parents[3]


def _child(out: Path, delay_s: float = 0.0) -> list[str]:
    return [sys.executable, "-m", "tests.engine_worker.runtime.pipe_child", str(out), str(delay_s)]


def _batch(i: int, text: str | None = None, final: bool = False) -> StepBatch:
    chunk = OutputChunk(job_id=f"job-{i % 3}", seq=i, text=text or f"t{i}é", completion_tokens=i)
    finals = (FinalResult(job_id=f"job-{i % 3}", text="done", finish_reason="stop", prompt_tokens=1,
                          completion_tokens=i),) if final else ()
    return StepBatch(chunks=(chunk,), finals=finals)


def _lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def _seqs(out: Path) -> list[int]:
    """The seqs of every chunk the child published, in order."""
    return [chunk[1] for line in _lines(out) for chunk in line["chunks"]]


def test_batches_arrive_in_order_and_close_waits_for_the_last_write(tmp_path):
    out = tmp_path / "out.jsonl"
    sink = PipeSink(_child(out, delay_s=0.01), cwd=str(ROOT))
    sink.start()

    for i in range(50):
        sink.publish(_batch(i, final=(i == 49)))
    assert sink.close(timeout=30)

    lines = _lines(out)
    assert _seqs(out) == list(range(50))
    assert lines[0]["chunks"][0][2] == "t0é" and lines[-1]["finals"] == ["job-1"]


def test_batches_that_wait_in_the_pipe_are_published_together(tmp_path):
    out = tmp_path / "out.jsonl"
    sink = PipeSink(_child(out, delay_s=0.2), cwd=str(ROOT))  # a sink slower than the engine
    sink.start()
    sink.publish(_batch(0))
    _wait_for_lines(out, 1)
    for i in range(1, 31):  # all written while the child is still publishing batch 0... or 1
        sink.publish(_batch(i, final=(i == 30)))
    assert sink.close(timeout=30)

    lines = _lines(out)
    assert _seqs(out) == list(range(31))
    assert len(lines) <= 3  # not 31 publishes
    assert lines[-1]["finals"] == ["job-0"]


def test_a_failed_batch_is_skipped_and_the_rest_still_published(tmp_path):
    out = tmp_path / "out.jsonl"
    sink = PipeSink(_child(out), cwd=str(ROOT))
    sink.start()

    sink.publish(_batch(0))
    sink.publish(_batch(1, text="boom"))
    sink.publish(_batch(2))
    sink.close()

    assert _seqs(out) == [0, 2]


def test_the_child_is_out_of_the_workers_process_group_and_ignores_sigint_and_sigterm(tmp_path):
    # Ctrl-C reaches every process of the worker's group: the worker drains, and its output
    # process must still be there to write the finals.
    out = tmp_path / "out.jsonl"
    sink = PipeSink(_child(out, delay_s=0.01), cwd=str(ROOT))
    sink.start()
    assert os.getpgid(sink.pid) != os.getpgid(0)
    sink.publish(_batch(0))
    _wait_for_lines(out, 1)  # serving: its handlers are installed
    for i in range(1, 20):
        sink.publish(_batch(i))

    os.kill(sink.pid, signal.SIGINT)
    os.kill(sink.pid, signal.SIGTERM)
    sink.publish(_batch(20, final=True))
    assert sink.close(timeout=30)

    assert _seqs(out) == list(range(21))


def test_the_child_finishes_its_writes_and_exits_when_the_parent_is_killed(tmp_path):
    out = tmp_path / "out.jsonl"
    pid_file = tmp_path / "child.pid"
    parent = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(ROOT)!r})
        from engine_worker.runtime.pipe_sink import PipeSink
        from tests.engine_worker.runtime.test_pipe_sink import _batch, _child
        from pathlib import Path
        sink = PipeSink(_child(Path({str(out)!r}), delay_s=0.02), cwd={str(ROOT)!r})
        sink.start()
        open({str(pid_file)!r}, "w").write(str(sink.pid))
        for i in range(10):
            sink.publish(_batch(i))
        os.kill(os.getpid(), 9)
    """)
    subprocess.run([sys.executable, "-c", parent], cwd=ROOT, timeout=60)
    child_pid = int(pid_file.read_text())

    deadline = time.monotonic() + 30
    while _alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.05)

    assert not _alive(child_pid)
    assert _seqs(out) == list(range(10))


def test_a_dead_child_is_replaced_and_the_batch_sent_again(tmp_path):
    out = tmp_path / "out.jsonl"
    sink = PipeSink(_child(out), cwd=str(ROOT))
    sink.start()
    sink.publish(_batch(0))
    first = sink.pid
    _wait_for_lines(out, 1)

    os.kill(first, signal.SIGKILL)
    os.waitpid(first, 0)
    sink.publish(_batch(1))
    sink.close()

    assert sink.pid is None and first is not None
    assert _seqs(out) == [0, 1]


def _wait_for_lines(out: Path, n: int) -> None:
    deadline = time.monotonic() + 30
    while len(_lines(out)) < n and time.monotonic() < deadline:
        time.sleep(0.02)


def test_a_child_that_keeps_dying_fails_the_sink_once_and_for_all(tmp_path):
    failures = []
    broken = [sys.executable, "-c", "raise SystemExit(3)"]  # exits at once, as on an import error
    sink = PipeSink(broken, cwd=str(ROOT), on_failure=lambda: failures.append(1))
    sink.start()

    with pytest.raises(SinkError):
        for i in range(20):
            sink.publish(_batch(i))
            time.sleep(0.1)  # let each new child die
    with pytest.raises(SinkError):
        sink.publish(_batch(99))

    assert failures == [1]
    sink.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (the parent is gone, init reaps it soon) counts as exited.
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(autouse=True)
def _python_path(monkeypatch):
    # The children import tests.* and engine_worker.* from the repository root.
    monkeypatch.setenv("PYTHONPATH", str(ROOT))


def test_merging_keeps_the_order_and_splits_where_a_job_starts_again():
    from engine_worker.protocol import FirstToken
    from engine_worker.runtime.pipe_sink import merge, merge_groups

    a1 = StepBatch(chunks=(OutputChunk(job_id="a", seq=1, text="x", completion_tokens=1),),
                   first_tokens=(FirstToken(job_id="a", at=1.0),), started=("a",))
    b1 = StepBatch(chunks=(OutputChunk(job_id="b", seq=1, text="y", completion_tokens=1),
                           OutputChunk(job_id="a", seq=2, text="z", completion_tokens=2)),
                   finals=(FinalResult(job_id="a", text="xz", finish_reason="stop", prompt_tokens=1,
                                       completion_tokens=2),), started=("b",))
    # Job a handed back and started here again: its stream is cleared before this batch's chunks,
    # so it must not be merged with the batches that wrote a's first attempt.
    a_again = StepBatch(chunks=(OutputChunk(job_id="a", seq=1, text="new", completion_tokens=1),), started=("a",))
    c1 = StepBatch(chunks=(OutputChunk(job_id="c", seq=1, text="w", completion_tokens=1),))

    groups = merge_groups([a1, b1, a_again, c1])
    assert groups == [[a1, b1], [a_again, c1]]
    merged = merge(groups[0])
    assert [(c.job_id, c.seq) for c in merged.chunks] == [("a", 1), ("b", 1), ("a", 2)]
    assert [f.job_id for f in merged.finals] == ["a"] and merged.started == ("a", "b")
    assert [t.job_id for t in merged.first_tokens] == ["a"]
    assert merge([c1]) is c1


def test_a_merged_batch_that_fails_is_published_again_part_by_part(monkeypatch):
    import pickle
    import struct

    from engine_worker.runtime import pipe_sink

    monkeypatch.setattr(pipe_sink.signal, "signal", lambda *args: None)  # serve_pipe's, not this process's

    class Sink:
        def __init__(self) -> None:
            self.published: list[list[int]] = []

        def publish(self, batch: StepBatch) -> None:
            if any(c.text == "boom" for c in batch.chunks):
                raise RuntimeError("this batch fails")
            self.published.append([c.seq for c in batch.chunks])

    read_fd, write_fd = os.pipe()
    for batch in (_batch(0), _batch(1, text="boom"), _batch(2)):  # all in the pipe before it is read
        frame = pickle.dumps(batch)
        os.write(write_fd, struct.pack(">I", len(frame)) + frame)
    os.close(write_fd)
    sink = Sink()
    with os.fdopen(read_fd, "rb") as stream:
        assert pipe_sink.serve_pipe(sink, stream) == 3
    assert sink.published == [[0], [2]]  # the merged publish failed; then each part alone
