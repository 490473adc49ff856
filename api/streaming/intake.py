"""The engine worker's side of its intake process (api/streaming/intake_process.py).

The child consumes the ``engine`` queue and writes each job id it is handed as a line to its
stdout; a reader thread here passes every id to ``admit`` (the worker's admission), in order.

* :meth:`IntakeProcess.start` starts the child. Call it before the model is loaded, as for the
  output process.
* :meth:`IntakeProcess.serve` starts the reader once there is something to admit to. Ids the
  child sent earlier wait in the pipe. A ``*`` line (the database's notice that jobs were queued,
  with ``--listen``) calls ``wake`` instead.
* :meth:`IntakeProcess.stop` closes the child's stdin: it stops consuming (Celery's warm
  shutdown) and exits. The reader passes on every id still in the pipe, then ends. An id that
  reaches ``admit`` while the worker stops is sent back to the queue there, as before.
* If the child dies, the reader passes on what it had written and starts a new one. A child
  that keeps dying (``MAX_RESTARTS`` starts within ``RESTART_WINDOW_S``) is a broken worker:
  ``on_failure`` is called once (the worker then shuts down, so its jobs go back to the queue).
* The child runs in a session of its own, so a Ctrl-C reaches only the worker, which stops it
  in order. If the worker dies, the child reads end of file on its stdin and stops.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable

from api.streaming.intake_process import WAKE_LINE
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
        self._child: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # a restart and a stop never cross
        self._reader: threading.Thread | None = None
        self._starts: deque[float] = deque(maxlen=MAX_RESTARTS)

    @property
    def pid(self) -> int | None:
        return self._child.pid if self._child is not None else None

    def start(self) -> None:
        self._spawn()

    def serve(self, admit: Callable[[str], bool], wake: Callable[[], None] | None = None) -> None:
        """Pass every id the child hands over to ``admit``, and every wake-up to ``wake``, on a
        thread of its own."""
        self._reader = threading.Thread(target=self._read, args=(admit, wake), name="worker-intake", daemon=True)
        self._reader.start()

    def stop(self, timeout: float) -> bool:
        """Stop the child, let the reader pass on the ids still in the pipe, and wait for both.
        False if the child had to be killed after ``timeout`` seconds."""
        with self._lock:
            self._stopping.set()
            child = self._child
        clean = child is None or end_child(child, timeout, "intake process")
        if self._reader is not None:
            self._reader.join(timeout)
        return clean

    def _spawn(self) -> subprocess.Popen[bytes]:
        self._starts.append(time.monotonic())
        self._child = subprocess.Popen(self._argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=self._cwd,
                                       env=self._env, close_fds=True, start_new_session=True)
        logger.info("intake process %s started", self._child.pid)
        return self._child

    def _read(self, admit: Callable[[str], bool], wake: Callable[[], None] | None) -> None:
        while True:
            child = self._child
            assert child is not None and child.stdout is not None
            for line in child.stdout:
                job_id = line.decode().strip()
                if job_id == WAKE_LINE:
                    if wake is not None:
                        wake()
                elif job_id:
                    try:
                        admit(job_id)
                    except Exception:  # the job stays queued in the database; the reconciler resends it
                        logger.exception("could not admit job %s", job_id)
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
                self._spawn()
            except OSError:  # cannot even start one (no memory, no processes left): as broken as dying
                logger.critical("could not start a new intake process; giving up", exc_info=True)
                if self._on_failure is not None:
                    self._on_failure()
                return False
            return True

    def _keeps_dying(self) -> bool:
        if len(self._starts) == MAX_RESTARTS and time.monotonic() - self._starts[0] < RESTART_WINDOW_S:
            logger.critical("intake process died %s times in %.0f s; giving up", MAX_RESTARTS, RESTART_WINDOW_S)
            if self._on_failure is not None:
                self._on_failure()
            return True
        return False
