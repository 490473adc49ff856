"""An :class:`OutputSink` in another process: the engine process only pickles each batch into a pipe.

In the engine worker, every thread shares one GIL with the engine thread. Profiled on the GPU
host (py-spy ``--gil``, 32 running jobs of the tiny model), the output path held the GIL about
as long as the engine thread itself: the Redis pipelines, the channel-layer fan-out on its event
loop, and the database writes. Each step waited behind them, and the service ran at 0.6-0.75 of
the in-process engine's tokens per second. :class:`PipeSink` leaves the engine process with the
coalescing and one ``pickle.dumps`` and ``write`` per batch. A child process (``argv``) runs the
real sink over :func:`serve_pipe`.

Order and delivery:

* Batches travel in order through one pipe. The child publishes every batch that has arrived
  while it was busy as one (:func:`merge_groups`). A child that falls further behind fills the
  pipe, and the write then blocks the I/O thread, which folds the steps that arrive meanwhile, as
  it does for a slow sink in-process. The backlog is bounded by the pipe's buffer.
* :meth:`PipeSink.close` closes the pipe and waits for the child. The child publishes what it has
  read, then exits on end of file, so an orderly stop leaves every final written.
* If the parent dies (even ``kill -9``), the child reads end of file, finishes and exits. It runs
  in a session of its own, so a Ctrl-C (or a signal to the worker's process group) reaches only
  the worker, and it ignores SIGINT and SIGTERM once running: neither can cut the writes short
  while the worker drains.
* If the child dies, the next ``publish`` starts a new one and sends the batch again. Batches that
  the dead child had read but not written are lost to the live path. A lost final's job is no
  longer held: its lease lapses, and the reconciler runs it again.
* A child that keeps dying (``MAX_RESTARTS`` starts within ``RESTART_WINDOW_S``: it cannot import,
  say) is a broken worker, not a lost batch: ``on_failure`` is called once (the worker then shuts
  down, so its jobs go back to the queue), and every later ``publish`` raises :class:`SinkError`.

Frames are a 4-byte big-endian length, then a pickle. Both ends are this project's own processes.
"""

from __future__ import annotations

import logging
import os
import pickle
import select
import signal
import struct
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import BinaryIO

from engine_worker.protocol import StepBatch
from engine_worker.runtime.child import end_child
from engine_worker.runtime.sink import OutputSink, SinkError

logger = logging.getLogger(__name__)

_HEADER = struct.Struct(">I")
_READ_SIZE = 1 << 20
MAX_RESTARTS = 3
RESTART_WINDOW_S = 60.0


class PipeSink:
    """Parent side. ``argv`` starts the child, which calls :func:`serve_pipe` on its stdin."""

    def __init__(self, argv: list[str], *, env: dict[str, str] | None = None, cwd: str | None = None,
                 on_failure: Callable[[], None] | None = None) -> None:
        self._argv = argv
        self._env = env
        self._cwd = cwd
        self._on_failure = on_failure
        self._lock = threading.Lock()
        self._child: subprocess.Popen[bytes] | None = None
        self._restarts: deque[float] = deque(maxlen=MAX_RESTARTS)
        self._failed = False

    def start(self) -> None:
        """Start the child. Call it before the model is loaded: the fork of ``subprocess`` execs
        at once, but a child started first never shares a page with mlx."""
        with self._lock:
            self._spawn()

    def publish(self, batch: StepBatch) -> None:
        frame = pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)
        frame = _HEADER.pack(len(frame)) + frame
        with self._lock:
            for attempt in (1, 2):
                child = self._child if self._child is not None and self._child.poll() is None else self._restart()
                try:
                    child.stdin.write(frame)  # type: ignore[union-attr]
                    child.stdin.flush()  # type: ignore[union-attr]
                    return
                except (BrokenPipeError, OSError) as exc:
                    logger.error("output process %s is gone (%s); %s", child.pid, exc,
                                 "starting a new one" if attempt == 1 else "giving up on this batch")
                    self._child = None
            raise SinkError("the output process could not be started")

    def close(self, timeout: float = 30.0) -> bool:
        """Close the pipe and wait for the child to write what it has. False if it had to be
        killed after ``timeout`` seconds."""
        with self._lock:
            child, self._child = self._child, None
        return child is None or end_child(child, timeout, "output process")

    @property
    def pid(self) -> int | None:
        return self._child.pid if self._child is not None else None

    def _restart(self) -> subprocess.Popen[bytes]:
        now = time.monotonic()
        if self._failed or (len(self._restarts) == MAX_RESTARTS and now - self._restarts[0] < RESTART_WINDOW_S):
            if not self._failed:
                self._failed = True
                logger.critical("output process died %s times in %.0f s; giving up", MAX_RESTARTS, RESTART_WINDOW_S)
                if self._on_failure is not None:
                    self._on_failure()
            raise SinkError("the output process keeps dying")
        self._restarts.append(now)
        return self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        self._child = subprocess.Popen(self._argv, stdin=subprocess.PIPE, env=self._env, cwd=self._cwd,
                                       close_fds=True, start_new_session=True)
        logger.info("output process %s started", self._child.pid)
        return self._child


def serve_pipe(sink: OutputSink, stream: BinaryIO) -> int:
    """Child side: publish every batch read from ``stream`` until end of file. Returns how many
    batches it published.

    The parent never waits for the child, so batches that arrive while the sink is busy wait in
    the pipe. They are then published together (:func:`merge_groups`): one database write, one
    Redis pipeline and one fan-out for all of them, where each would pay its own round trips (32
    finals on consecutive steps, say). A merged batch the sink fails on is published again part by
    part, so one bad batch still costs only itself; clients drop what reaches them twice by seq."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    published = 0
    for batches in _frames(stream.fileno()):
        for group in merge_groups(batches):
            if not _publish(sink, merge(group)) and len(group) > 1:
                logger.warning("publishing the %s merged batches one by one", len(group))
                for batch in group:
                    _publish(sink, batch)
        published += len(batches)
    return published


def _publish(sink: OutputSink, batch: StepBatch) -> bool:
    try:
        sink.publish(batch)
        return True
    except Exception:  # as the I/O thread does: one failed batch must not stop the rest
        logger.exception("output sink failed for a batch of %s chunks, %s finals", len(batch.chunks),
                         len(batch.finals))
        return False


def merge_groups(batches: list[StepBatch]) -> list[list[StepBatch]]:
    """Split consecutive batches into as few groups as keep the sink's order when each group is
    published as one (:func:`merge`). A batch that starts a job (``started``: the sink clears the
    job's stream before writing the batch's chunks) opens a new group when the group so far has
    output of that job, which the clearing must not erase."""
    groups: list[list[StepBatch]] = []
    seen: set[str] = set()
    for batch in batches:
        if not groups or seen.intersection(batch.started):
            groups.append([])
            seen = set()
        groups[-1].append(batch)
        seen.update(c.job_id for c in batch.chunks)
        seen.update(f.job_id for f in batch.finals)
    return groups


def merge(group: list[StepBatch]) -> StepBatch:
    """One batch with the chunks, finals, first tokens and started jobs of ``group``, in order."""
    if len(group) == 1:
        return group[0]
    return StepBatch(chunks=tuple(c for b in group for c in b.chunks), finals=tuple(f for b in group for f in b.finals),
                     first_tokens=tuple(t for b in group for t in b.first_tokens),
                     started=tuple(j for b in group for j in b.started))


def _frames(fd: int) -> Iterator[list[StepBatch]]:
    """The batches read from ``fd``: each time, every complete frame that has arrived (at least
    one), until end of file. Waits only when no complete frame is buffered."""
    buffer = bytearray()
    while True:
        frames = _complete_frames(buffer)
        if frames and _readable(fd):
            buffer += os.read(fd, _READ_SIZE)  # one more read of what is there: bounded, never starves
            frames += _complete_frames(buffer)
        if frames:
            yield frames
            continue
        data = os.read(fd, _READ_SIZE)
        if not data:
            if buffer:
                logger.error("output pipe closed in the middle of a batch")
            return
        buffer += data


def _complete_frames(buffer: bytearray) -> list[StepBatch]:
    """Take the complete frames off the front of ``buffer``."""
    out = []
    offset = 0
    while len(buffer) - offset >= _HEADER.size:
        (size,) = _HEADER.unpack_from(buffer, offset)
        end = offset + _HEADER.size + size
        if end > len(buffer):
            break
        out.append(pickle.loads(buffer[offset + _HEADER.size:end]))
        offset = end
    del buffer[:offset]
    return out


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])
