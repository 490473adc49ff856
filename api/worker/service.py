"""The engine worker's service object: one per worker process, used by the Celery task.

It owns the host of the engine (an :class:`EngineProcess` in a worker: the engine in a child
process, its outputs written here by the I/O thread) and the worker's periodic duties
(control.py, run on that I/O thread). ``run_job`` (api/jobs/tasks.py) calls :meth:`admit` on the
Celery consumer's thread: one claim of every queued job the engine has room for, and one hand-over
of them all to the engine, which batches them with those it is running.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import redis
from django.db import DatabaseError, close_old_connections

from api.jobs.services import claim as job_claims
from api.jobs.services import lifecycle as job_lifecycle
from api.jobs.services import outputs as job_outputs
from api.models import Job, JobStatus
from api.worker.admission import stream_restart
from api.worker.config import WorkerConfig
from api.worker.control import WorkerControl
from engine_worker.protocol import JobSpec
from engine_worker.runtime import Host, OutputSink

logger = logging.getLogger(__name__)

_current: EngineWorkerService | None = None


def install(service: EngineWorkerService | None) -> None:
    global _current
    _current = service


def current() -> EngineWorkerService | None:
    """The service of this process, if it is an engine worker."""
    return _current


# (sink, on_tick, on_refused) -> the host; the host calls on_refused(job_id, error, job_fault) for
# a job its engine would not start, classified on the engine side (engine_worker.runtime.host.refusal).
HostFactory = Callable[[OutputSink, Callable[[], None], Callable[[str, str, bool], None]], Any]


class EngineWorkerService:
    def __init__(self, *, config: WorkerConfig, make_host: HostFactory, sink: OutputSink,
                 redis_client: redis.Redis, dispatch: Callable[[str], None]) -> None:
        self.config = config
        self._redis = redis_client
        self._dispatch = dispatch
        self.host: Host = make_host(sink, self._tick, self._refused)
        self.control = WorkerControl(worker_id=config.worker_id, host=self.host, redis_client=redis_client,
                                     heartbeat_s=config.heartbeat_s, lease_s=config.lease_s)
        self._stopping = False

    @property
    def worker_id(self) -> str:
        return self.config.worker_id

    def start(self) -> None:
        self.host.start()
        self.control.beat()  # visible to /health and the dashboard before the first job arrives

    # -- jobs ---------------------------------------------------------------------------------

    def admit(self, job_id: str) -> bool:
        """Claim ``job_id``, and with it every other queued job of this worker's model that its
        engine has room for, in one statement, and start them in the engine in one hand-over.
        Returns whether ``job_id`` started here. False when it is not ours to run: someone else
        holds it (a batch claim of this worker's, say: its message is then a no-op), it was
        cancelled or finished, or this worker is stopping (the job is then sent back to the queue
        for another worker)."""
        if self.host.holds(job_id):
            return False  # delivered twice, or claimed with an earlier message's batch
        if self._stopping or not self.host.engine_running():
            self._redispatch(job_id)
            return False
        try:
            jobs = job_claims.jobs_claim(job_id=job_id, worker_id=self.worker_id, lease_s=self.config.lease_s,
                                         model=self.config.model_name, limit=self.host.free_slots())
            if not any(str(job.id) == job_id for job in jobs):
                if job_claims.job_queued_for_other_model(job_id=job_id, model=self.config.model_name):
                    self._redispatch(job_id)  # a message on the old shared queue: to its model's queue
        except DatabaseError:  # they stay queued in the database; the reconciler sends them again
            logger.warning("could not claim job %s", job_id, exc_info=True)
            close_old_connections()
            return False
        started = self._start([spec for spec in map(self._spec, jobs) if spec is not None])
        return job_id in started

    def _spec(self, job: Job) -> JobSpec | None:
        """The claimed job's wire form (its stream restarted if it ran before); None when it cannot
        start here (it was refused: failed alone, or handed back)."""
        try:
            first_seq = stream_restart(redis_client=self._redis, job=job) if job.attempts > 1 else 1
            return job_claims.job_spec(job, first_seq=first_seq)
        except (ValueError, TypeError) as exc:  # its stored parameters are malformed: it fails alone
            self._refused(str(job.id), str(exc), True)
        except Exception as exc:  # this worker's trouble (Redis), not the job's: another may run it
            logger.exception("could not prepare job %s here", job.id)
            self._refused(str(job.id), str(exc), False)
        return None

    def _start(self, specs: list[JobSpec]) -> set[str]:
        """Hand claimed jobs to the engine; returns the ids it started."""
        if not specs:
            return set()
        started = set(self.host.submit_many(specs))
        # Not started: the host is draining, or its engine refused the job at once (_refused has
        # failed it or handed it back already, and this conditional hand-back changes nothing).
        self._hand_back([spec.job_id for spec in specs if spec.job_id not in started])
        return started

    def _refused(self, job_id: str, error: str, job_fault: bool) -> None:
        """The job cannot start here: it fails alone when the fault is its own, else it goes back
        to the queue for another worker. The engine side says which (``job_fault``)."""
        if job_fault:
            logger.warning("job %s cannot run: %s", job_id, error)
            job_outputs.job_fail(job_id=job_id, worker_id=self.worker_id, error=error)
        else:
            logger.warning("job %s could not start here (%s); handing it back", job_id, error)
            self._hand_back([job_id])

    def cancel(self, job_id: str) -> bool:
        return self.host.cancel(job_id)

    # -- shutdown -----------------------------------------------------------------------------

    def shutdown(self) -> list[str]:
        """Let running jobs finish for up to ``drain_s`` seconds, hand the rest back to the queue
        (and re-dispatch them), write every output and stop the I/O thread. Returns the
        handed-back ids. The engine itself is stopped by the caller."""
        self._stopping = self.control.stopping = True
        remaining = self.host.drain(self.config.drain_s)
        if remaining:
            logger.info("handing back %s unfinished jobs", len(remaining))
        handed_back = self._hand_back(remaining)
        self.host.stop()  # every output of the engine is written
        self.control.close()
        return handed_back

    def _redispatch(self, job_id: str) -> None:
        """Send a still-queued job back to the broker for another worker."""
        try:
            self._dispatch(job_id)
        except Exception:  # any broker failure: the job is queued in the DB, the reconciler sends it
            logger.warning("could not re-dispatch job %s; the reconciler will", job_id, exc_info=True)

    def _hand_back(self, job_ids: list[str]) -> list[str]:
        released = self.host.hand_back(job_ids) if job_ids else []
        for job_id in set(job_ids):
            status = job_lifecycle.job_hand_back(
                job_id=job_id, worker_id=self.worker_id, redispatch_after_s=self.config.redispatch_after_s)
            if status == JobStatus.QUEUED:  # a cancelled one ends instead
                self._redispatch(job_id)
        return released

    def _tick(self) -> None:
        self.control.tick()
