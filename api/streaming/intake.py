"""The engine worker's side of its intake process (api/streaming/intake_process.py).

The child consumes the ``engine`` queue, claims the jobs for this worker and writes each claimed
job's spec as a JSON line to its stdout; a reader thread here passes every spec to ``start``
(the worker starts it in its engine), in order.

* :meth:`IntakeProcess.start` starts the child. Call it before the model is loaded, as for the
  output process.
* :meth:`IntakeProcess.serve` starts the reader once there is something to start jobs in. Specs
  the child sent earlier wait in the pipe.
* :meth:`IntakeProcess.release` tells the child that the worker no longer holds a job (it
  finished, was handed back or refused), so the child counts the worker's free room right.
* :meth:`IntakeProcess.stop` closes the child's stdin: it stops claiming and consuming (Celery's
  warm shutdown) and exits. The reader passes on every spec still in the pipe, then ends.
* If the child dies, the reader passes on what it had written and starts a new one, and tells it
  which jobs the worker holds (``held_jobs``). A child that keeps dying (``MAX_RESTARTS`` starts
  within ``RESTART_WINDOW_S``) is a broken worker: ``on_failure`` is called once (the worker then
  shuts down, so its jobs go back to the queue).
* The child runs in a session of its own, so a Ctrl-C reaches only the worker, which stops it
  in order. If the worker dies, the child reads end of file on its stdin and stops.
"""

from __future__ import annotations

import json
import logging
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable

from api.streaming.intake_process import HELD, RELEASED
from engine_worker.protocol import JobSpec, from_dict
from engine_worker.runtime.child import end_child

logger = logging.getLogger(__name__)

MAX_RESTARTS = 3
RESTART_WINDOW_S = 60.0


class IntakeProcess:
    def __init__(self, argv: list[str], *, cwd: str | None = None, env: dict[str, str] | None = None,
                 on_failure: Callable[[], None] | None = None) -> None:
        self._argv = argv
        self._cwd = cwd
        self._env = env
        self._on_failure = on_failure
        self._held_jobs: Callable[[], list[str]] | None = None
        self._child: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        # A restart, a stop and the lines to the child's stdin never cross: a release reaches
        # the child that counted the job, or the new one after the held jobs it was told about.
        self._lock = threading.Lock()
        self._reader: threading.Thread | None = None
        self._starts: deque[float] = deque(maxlen=MAX_RESTARTS)

    @property
    def pid(self) -> int | None:
        return self._child.pid if self._child is not None else None

    def start(self) -> None:
        self._spawn()

    def serve(self, start: Callable[[JobSpec], None], *, held_jobs: Callable[[], list[str]] | None = None) -> None:
        """Pass every job the child claimed to ``start``, on a thread of its own. ``held_jobs``:
        the jobs the worker holds, which a child started again is told about."""
        if held_jobs is not None:
            self._held_jobs = held_jobs
        self._reader = threading.Thread(target=self._read, args=(start,), name="worker-intake", daemon=True)
        self._reader.start()

    def release(self, job_id: str) -> None:
        """The worker no longer holds ``job_id``: the child may claim in its place."""
        self._tell(f"{RELEASED} {job_id}\n")

    def stop(self, timeout: float) -> bool:
        """Stop the child, let the reader pass on the specs still in the pipe, and wait for both.
        False if the child had to be killed after ``timeout`` seconds."""
        with self._lock:
            self._stopping.set()
            child = self._child
            if child is not None:
                _close(child)
        clean = child is None or end_child(child, timeout, "intake process")
        if self._reader is not None:
            self._reader.join(timeout)
        return clean

    def _tell(self, lines: str) -> None:
        with self._lock:
            child = self._child
            if child is None or child.stdin is None or self._stopping.is_set():
                return
            try:
                child.stdin.write(lines.encode())
                child.stdin.flush()
            except (OSError, ValueError):  # it died: its successor is told what is held
                pass

    def _spawn(self) -> subprocess.Popen[bytes]:
        self._starts.append(time.monotonic())
        self._child = subprocess.Popen(self._argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=self._cwd,
                                       env=self._env, close_fds=True, start_new_session=True)
        logger.info("intake process %s started", self._child.pid)
        return self._child

    def _read(self, start: Callable[[JobSpec], None]) -> None:
        while True:
            child = self._child
            assert child is not None and child.stdout is not None
            for line in child.stdout:
                if not line.strip():
                    continue
                spec = _parse(line)
                if spec is None:  # not ours to run; a job behind it is requeued once its lease runs out
                    logger.error("intake process: ignoring a malformed line %r", line[:120])
                    continue
                try:
                    start(spec)
                except Exception:  # claimed but not started: its lease runs out, then it is requeued
                    logger.exception("could not start job %s", spec.job_id)
            child.wait()
            if not self._restart(child.returncode):
                return

    def _restart(self, returncode: int | None) -> bool:
        with self._lock:
            if self._stopping.is_set():
                return False
            if self._keeps_dying():
                return False
            logger.error("intake process exited (code %s); starting a new one", returncode)
            try:
                child = self._spawn()
            except OSError:  # cannot even start one (no memory, no processes left): as broken as dying
                logger.critical("could not start a new intake process; giving up", exc_info=True)
                if self._on_failure is not None:
                    self._on_failure()
                return False
            held = self._held_jobs() if self._held_jobs is not None else []
            if held:
                try:
                    child.stdin.write("".join(f"{HELD} {job_id}\n" for job_id in held).encode())  # type: ignore[union-attr]
                    child.stdin.flush()  # type: ignore[union-attr]
                except OSError:  # dead already: the reader finds out and starts the next one
                    pass
            return True

    def _keeps_dying(self) -> bool:
        if len(self._starts) == MAX_RESTARTS and time.monotonic() - self._starts[0] < RESTART_WINDOW_S:
            logger.critical("intake process died %s times in %.0f s; giving up", MAX_RESTARTS, RESTART_WINDOW_S)
            if self._on_failure is not None:
                self._on_failure()
            return True
        return False


def _close(child: subprocess.Popen[bytes]) -> None:
    try:
        if child.stdin is not None:
            child.stdin.close()
    except OSError:
        pass


def _parse(line: bytes) -> JobSpec | None:
    try:
        data = json.loads(line)
        return from_dict(JobSpec, data) if isinstance(data, dict) else None
    except (ValueError, TypeError):  # not JSON, or not a spec's fields
        return None
