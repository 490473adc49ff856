"""The intake process's admission: what ``run_job`` finds there as ``worker.current()``.

It claims the jobs it is handed (and the queue's head at the database's notice) for the engine
worker, through an admission thread as the worker's own (admission.py, claimer.py), and writes
each claimed job's :class:`JobSpec` to the worker as one JSON line (read by intake.py). See
intake_process.py for the process around it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from typing import BinaryIO

from django.db import DatabaseError, close_old_connections

from api.services import job_lifecycle
from api.streaming.admission import AdmissionThread
from api.streaming.claimer import ClaimedJobs, Claimer
from engine_worker.protocol import JobSpec, to_dict

logger = logging.getLogger(__name__)

STOP_TIMEOUT_S = 10.0


class IntakeAdmission:
    """What ``run_job`` finds as this process's ``worker.current()``: it claims the jobs and
    writes their specs to the worker."""

    def __init__(self, pipe: BinaryIO, *, claimer: Claimer, claimed: ClaimedJobs, min_interval_s: float = 0.0,
                 redispatch_after_s: float = 30.0) -> None:
        self._pipe = pipe
        self._claimer = claimer
        self._claimed = claimed
        self._redispatch_after_s = redispatch_after_s
        self._gone = threading.Event()  # the worker's end of the pipe is closed
        self._admission = AdmissionThread(self._claim_and_send, min_interval_s=min_interval_s)

    def start(self) -> None:
        self._admission.start()

    def admit(self, job_id: str) -> bool:
        if self._admission.put(job_id):
            return True
        _send_back(job_id)  # stopping: for another worker
        return False

    def wake(self) -> bool:
        """Jobs were queued (the database's notice): claim the queue's head. False once stopping."""
        if self._gone.is_set():
            return False
        self._admission.wake()
        return True

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Claim nothing more; the ids not claimed yet go back to the queue."""
        for job_id in self._admission.stop(timeout):
            _send_back(job_id)

    def _claim_and_send(self, job_ids: list[str], woken: bool = False) -> bool:
        if self._gone.is_set():
            for job_id in job_ids:
                _send_back(job_id)
            return False
        try:
            specs = self._claimer.claim(job_ids, woken=woken)
        except DatabaseError:
            # They stay queued in the database; the reconciler sends them again.
            logger.warning("could not claim %s jobs", len(job_ids), exc_info=True)
            close_old_connections()
            return True
        if specs is None:
            return False
        if specs:
            for spec in specs:
                self._claimed.add(spec.job_id)
            if not self._write(specs):
                self._worker_gone(specs)
        return True

    def _write(self, specs: list[JobSpec]) -> bool:
        lines = b"".join(json.dumps(to_dict(spec), separators=(",", ":")).encode() + b"\n" for spec in specs)
        try:
            self._pipe.write(lines)
            self._pipe.flush()
            return True
        except (OSError, ValueError):  # the worker's end is gone (ValueError: closed here already)
            return False

    def _worker_gone(self, specs: list[JobSpec]) -> None:
        self._gone.set()
        logger.warning("the engine worker is gone; sending %s claimed jobs back to the queue", len(specs))
        for spec in specs:
            self._claimed.discard(spec.job_id)
            try:
                if job_lifecycle.job_requeue(job_id=spec.job_id, worker_id=self._claimer.worker_id,
                                             redispatch_after_s=self._redispatch_after_s):
                    _send_back(spec.job_id)
            except Exception:  # its lease expires and the reconciler hands it back
                logger.warning("could not hand job %s back", spec.job_id, exc_info=True)
        stop_consuming()


def _send_back(job_id: str) -> None:
    from api.tasks import dispatch_job

    try:
        dispatch_job(job_id)
    except Exception:  # the row is still queued: the reconciler sends it
        logger.warning("could not send job %s back; the reconciler will", job_id, exc_info=True)


def stop_consuming() -> None:
    """SIGTERM to this process: Celery's warm shutdown of its consumer."""
    os.kill(os.getpid(), signal.SIGTERM)
