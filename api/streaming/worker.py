"""The engine worker's service object: one per worker process, shared by the Celery task.

It owns the :class:`JobHost` (engine thread + I/O thread), and two threads of its own:

* heartbeat: every ``heartbeat_s``, publish the worker's heartbeat to Redis (with a TTL), renew
  the leases of the jobs it holds (one UPDATE), and cancel held jobs whose cancellation is in the
  database (a fallback for a lost pub/sub message);
* cancel listener: the ``engine:cancel`` pub/sub channel, so a cancel reaches the engine within
  a second.

``run_job`` calls :meth:`admit`, which hands the job id to the admission thread
(admission.py) and returns: that thread claims whatever has arrived with one conditional UPDATE
and hands the jobs to the engine without waiting for them to run, so one Celery consumer admits
any number of jobs into the engine's continuous batch.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from collections.abc import Callable

import redis
from django.db import DatabaseError, close_old_connections

from api.keys import CANCEL_CHANNEL, WORKER_HEARTBEAT_TTL_S, worker_heartbeat_key
from api.services import job_lifecycle
from api.streaming.admission import AdmissionThread
from api.streaming.config import WorkerConfig
from api.streaming.fanout import GroupSender
from engine_worker.errors import RequestError
from engine_worker.protocol import to_dict
from engine_worker.runtime import JobHost

logger = logging.getLogger(__name__)

_current: EngineWorkerService | None = None


def keep_database_connections() -> None:
    """A worker is a long-running process, not a request handler: keep its connections open.
    (Celery's Django fixup closes connections after every task when CONN_MAX_AGE is 0, the web
    default, which would make each job admission reconnect to the database.)"""
    from django.conf import settings
    from django.db import connections

    for alias in settings.DATABASES:
        settings.DATABASES[alias]["CONN_MAX_AGE"] = None
        connections[alias].settings_dict["CONN_MAX_AGE"] = None


def install(service: EngineWorkerService | None) -> None:
    global _current
    _current = service


def current() -> EngineWorkerService | None:
    """The service of this process, if it is an engine worker."""
    return _current


class EngineWorkerService:
    def __init__(
        self, *, config: WorkerConfig, host: JobHost, redis_client: redis.Redis, sender: GroupSender | None,
        dispatch: Callable[[str], None],
    ) -> None:
        self.config = config
        self.host = host
        self._redis = redis_client
        self._sender = sender
        self._dispatch = dispatch
        self._stop = threading.Event()
        self._admission = AdmissionThread(self._admit_batch, min_interval_s=config.claim_interval_s)
        self._threads = [
            threading.Thread(target=self._heartbeat_loop, name="worker-heartbeat", daemon=True),
            threading.Thread(target=self._cancel_loop, name="worker-cancel", daemon=True),
        ]

    @property
    def worker_id(self) -> str:
        return self.config.worker_id

    def start(self) -> None:
        self.host.start()
        self._admission.start()
        self._beat()  # visible to /health and the dashboard before the first job arrives
        for thread in self._threads:
            thread.start()

    # -- jobs ---------------------------------------------------------------------------------

    def admit(self, job_id: str) -> bool:
        """Queue ``job_id`` for admission (see admission.py). False when this worker is stopping:
        the job is then sent back to the queue for another worker."""
        if self._admission.put(job_id):
            return True
        self._redispatch([job_id])
        return False

    def wake(self) -> None:
        """The database says jobs were queued (queue_listener.py): claim from the queue's head, as
        far as the engine's running batch has room, without waiting for their messages."""
        self._admission.wake()

    def _admit_batch(self, job_ids: list[str], woken: bool = False) -> bool:
        """Claim the jobs (those not claimable are duplicates, cancelled or finished: ignored) and
        start them in the engine. Ids this worker already holds (claimed ahead of their message,
        or delivered twice) cost no claim. ``woken``: jobs were queued, so claim ahead even with
        no new id in hand (a full worker leaves them to the others). Returns whether it claimed
        (the admission thread spaces claims, not batches that needed none)."""
        job_ids = [job_id for job_id in job_ids if not self.host.holds(job_id)]
        if not self.host.engine_running():
            # This worker is going down (the heartbeat stops it). Claiming only to hand the jobs
            # back would requeue them, and the requeue's notice would wake this worker again.
            self._redispatch(job_ids)
            return False
        ahead = 0
        if self.config.claim_ahead:
            # Room left in the engine's running batch: take that many more from the queue's head.
            ahead = max(0, self.config.claim_ahead - len(self.host.held_jobs()) - len(job_ids))
        if not job_ids and not (woken and ahead):
            return False
        try:
            jobs = job_lifecycle.jobs_claim(job_ids=job_ids, worker_id=self.worker_id, lease_s=self.config.lease_s,
                                            ahead=ahead)
        except DatabaseError:
            # They stay queued in the database; the reconciler sends them again.
            logger.warning("could not claim %s jobs", len(job_ids), exc_info=True)
            close_old_connections()
            return True
        delivered = set(job_ids)
        missed = len(delivered - {str(job.id) for job in jobs})
        if missed:
            logger.debug("%s of %s deliveries not claimable by %s (claimed ahead, cancelled or finished); ignored",
                         missed, len(delivered), self.worker_id)
        refused = []
        for job in jobs:
            job_id = str(job.id)
            try:
                spec = job_lifecycle.job_spec(job)  # malformed stored params raise ValueError/TypeError
                if not self.host.submit(spec):
                    refused.append(job_id)  # draining
            except (RequestError, ValueError, TypeError) as exc:  # this job cannot run anywhere: it fails alone
                logger.warning("job %s cannot run: %s", job_id, exc)
                job_lifecycle.job_fail(job_id=job_id, worker_id=self.worker_id, error=str(exc))
            except Exception:  # the engine's trouble, not the job's: another worker may run it
                logger.exception("could not start job %s here; handing it back", job_id)
                refused.append(job_id)
        if refused:  # give them straight back so another worker takes them
            self._hand_back(refused)
        return True

    def cancel(self, job_id: str) -> bool:
        return self.host.cancel(job_id)

    # -- shutdown -----------------------------------------------------------------------------

    def shutdown(self) -> list[str]:
        """Let running jobs finish for up to ``drain_s`` seconds, hand the rest back to the queue
        (and re-dispatch them), flush outputs and stop the threads. Returns the handed-back ids.
        The engine itself is stopped by the caller."""
        self._redispatch(self._admission.stop(self.config.heartbeat_s + 5.0))
        remaining = self.host.drain(self.config.drain_s)
        if remaining:
            logger.info("handing back %s unfinished jobs", len(remaining))
        handed_back = self._hand_back(remaining)
        self.host.stop()
        self._stop.set()
        for thread in self._threads:
            thread.join(self.config.heartbeat_s + 2.0)
        try:
            self._redis.delete(worker_heartbeat_key(self.worker_id))
        except redis.RedisError:
            logger.warning("could not delete the heartbeat key", exc_info=True)
        if self._sender is not None:
            self._sender.close()
        return handed_back

    def _redispatch(self, job_ids: list[str]) -> None:
        """Send still-queued jobs (never claimed here) back to the broker for another worker."""
        for job_id in job_ids:
            try:
                self._dispatch(job_id)
            except Exception:  # any broker failure: the job is queued in the DB, the reconciler sends it
                logger.warning("could not re-dispatch job %s; the reconciler will", job_id, exc_info=True)

    def _hand_back(self, job_ids: list[str]) -> list[str]:
        released = self.host.hand_back(job_ids) if job_ids else []
        for job_id in set(job_ids):
            if job_lifecycle.job_requeue(
                job_id=job_id, worker_id=self.worker_id, redispatch_after_s=self.config.redispatch_after_s
            ):
                self._redispatch([job_id])
        return released

    # -- heartbeat ----------------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.config.heartbeat_s):
            self._beat()

    def _beat(self) -> None:
        if not self.host.engine_running() and not self._stop.is_set():
            self._engine_died()
            return
        held = self.host.held_jobs()
        try:
            beat = self.host.heartbeat(self.worker_id)
            self._redis.set(
                worker_heartbeat_key(self.worker_id), json.dumps(to_dict(beat)), ex=WORKER_HEARTBEAT_TTL_S
            )
        except redis.RedisError:
            logger.warning("heartbeat publish failed", exc_info=True)
        try:
            job_lifecycle.job_renew_leases(worker_id=self.worker_id, job_ids=held, lease_s=self.config.lease_s)
            for job_id in job_lifecycle.jobs_cancel_requested(worker_id=self.worker_id, job_ids=held):
                self.host.cancel(job_id)
        except DatabaseError:
            logger.warning("lease renewal failed", exc_info=True)
            close_old_connections()

    def _engine_died(self) -> None:
        """The engine thread is gone (a fatal error, not one request's failure): stop this
        worker through the normal SIGTERM path, so it exits, its supervisor restarts it, and
        jobs it still holds go back to the queue."""
        logger.critical("engine thread is not running; shutting worker %s down", self.worker_id)
        self._stop.set()
        os.kill(os.getpid(), signal.SIGTERM)

    # -- cancel listener ----------------------------------------------------------------------

    def _cancel_loop(self) -> None:
        while not self._stop.is_set():
            try:
                pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(CANCEL_CHANNEL)
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=0.5)
                    if message is not None:
                        self._on_cancel_message(message.get("data"))
                pubsub.close()
            except redis.RedisError:
                logger.warning("cancel subscription lost; retrying", exc_info=True)
                self._stop.wait(1.0)

    def _on_cancel_message(self, data: object) -> None:
        try:
            job_id = str(json.loads(data)["job_id"])  # type: ignore[arg-type]
        except (TypeError, ValueError, KeyError):
            logger.warning("ignoring malformed cancel message %r", data)
            return
        if self.host.cancel(job_id):
            logger.info("cancelled job %s", job_id)
