"""Claiming jobs for one engine worker: delivered ids, and the queue's head up to its free room.

A claim is one conditional UPDATE (``job_lifecycle.jobs_claim``) that turns queued rows into the
worker's running jobs; what comes back is the engine's :class:`JobSpec` for each. It runs where
the worker's jobs arrive: in the intake process (intake_process.py), which then writes the specs
to the worker, or in the worker itself when it has no intake process. In the intake process a
claim's database round trip and the Python that builds its rows (about a millisecond of CPU per
claim on the GPU host, 12-19 claims in a 32-job burst) no longer take the GIL from the engine
thread while that burst is being prefilled.

``held`` is what the worker holds, as far as the claimer can know: the worker's own jobs when the
claim runs in the worker, or in the intake process every job it claimed that the worker has not
released yet (:class:`ClaimedJobs`), an upper bound of the worker's that never lets it claim more
than its room.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from api.services import job_lifecycle
from engine_worker.protocol import JobSpec

logger = logging.getLogger(__name__)


class HeldJobs(Protocol):
    def holds(self, job_id: str) -> bool: ...
    def held_count(self) -> int: ...


class ClaimedJobs:
    """The intake process's account of the worker's jobs: added when claimed (or when the worker
    says it holds them, after a restart of this process), removed when the worker releases them."""

    def __init__(self) -> None:
        self._ids: set[str] = set()
        self._lock = threading.Lock()

    def add(self, job_id: str) -> None:
        with self._lock:
            self._ids.add(job_id)

    def discard(self, job_id: str) -> None:
        with self._lock:
            self._ids.discard(job_id)

    def holds(self, job_id: str) -> bool:
        with self._lock:
            return job_id in self._ids

    def held_count(self) -> int:
        with self._lock:
            return len(self._ids)


class Claimer:
    def __init__(self, *, worker_id: str, lease_s: float, claim_ahead: int, held: HeldJobs) -> None:
        """``claim_ahead``: held jobs up to which a claim also takes queued jobs whose message
        has not come yet (0: only delivered ids)."""
        self.worker_id = worker_id
        self._lease_s = lease_s
        self._claim_ahead = claim_ahead
        self._held = held

    def claim(self, job_ids: list[str], *, woken: bool = False) -> list[JobSpec] | None:
        """Claim the delivered ``job_ids`` this worker does not hold yet, and, as far as its room
        goes, the queue's head (``woken``: jobs were queued, so claim the head even with no id in
        hand). Returns the claimed jobs' specs, or None when there was nothing to claim and no
        query was made (the admission thread spaces claims, not batches that needed none).

        Ids not claimable (duplicates, cancelled, finished, another worker's) are ignored. A
        claimed job whose stored parameters cannot make a spec fails at once; it could not run on
        any worker. Raises the database's errors: the jobs then stay queued."""
        job_ids = [job_id for job_id in job_ids if not self._held.holds(job_id)]
        ahead = 0
        if self._claim_ahead:
            ahead = max(0, self._claim_ahead - self._held.held_count() - len(job_ids))
        if not job_ids and not (woken and ahead):
            return None
        jobs = job_lifecycle.jobs_claim(job_ids=job_ids, worker_id=self.worker_id, lease_s=self._lease_s, ahead=ahead)
        missed = len(set(job_ids) - {str(job.id) for job in jobs})
        if missed:
            logger.debug("%s of %s deliveries not claimable by %s (claimed ahead, cancelled or finished); ignored",
                         missed, len(job_ids), self.worker_id)
        specs = []
        for job in jobs:
            try:
                specs.append(job_lifecycle.job_spec(job))
            except (ValueError, TypeError) as exc:  # malformed stored params: no worker can run it
                logger.warning("job %s cannot run: %s", job.id, exc)
                job_lifecycle.job_fail(job_id=str(job.id), worker_id=self.worker_id, error=str(exc))
        return specs
