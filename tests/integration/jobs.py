"""Creating and watching jobs from an integration test."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.utils import timezone

from api.common.redis_keys import job_stream_key
from api.jobs.services.dispatch import job_dispatch_counted
from api.models import ApiKey, Job, JobStatus
from api.serving.tokenization import get_tokenizer
from tests.api.factories import make_api_key
from tests.integration.procs import Proc, wait_for

JOB_TIMEOUT_S = 240.0


def queue_job(prompt: str, *, max_tokens: int, ignore_eos: bool = True, dispatch: bool = True,
              api_key: ApiKey | None = None, held_by: str | None = None, **params: Any) -> str:
    """Insert a queued job (as ``job_create`` would, without quotas) and send it to the broker.
    ``ignore_eos`` makes its length exact, so a test knows it is still running. ``held_by``: the
    job is in progress on that (stalled) worker instead, with a minute's lease, and not sent."""
    if api_key is None:
        api_key, _secret = make_api_key()
    job = Job.objects.create(
        owner=api_key.owner,
        api_key=api_key,
        prompt=prompt,
        prompt_token_ids=get_tokenizer().encode_prompt(prompt),
        params={"max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": ignore_eos, **params},
        **({"status": JobStatus.IN_PROGRESS, "worker_id": held_by,
            "lease_expires_at": timezone.now() + dt.timedelta(seconds=60)} if held_by else {}),
    )
    if dispatch and not held_by:
        assert job_dispatch_counted(job_id=str(job.id))
    return str(job.id)


def wait_streaming(redis_db, job_id: str, worker: Proc, entries: int = 3, timeout: float = 120.0) -> None:
    """Wait until ``job_id``'s stream holds ``entries`` entries; on timeout the failure shows the
    job's row and ``worker``'s log."""
    try:
        wait_for(lambda: redis_db.xlen(job_stream_key(job_id)) >= entries, timeout, f"job {job_id} to stream")
    except AssertionError as exc:
        row = Job.objects.filter(id=job_id).values("status", "model", "worker_id", "attempts", "dispatch_count",
                                                   "routed_worker", "error").first()
        raise AssertionError(f"{exc}\njob row: {row}\n{worker.name} log:\n{worker.log_tail()}") from None


def job(job_id: str) -> Job:
    return Job.objects.get(id=job_id)


def wait_status(job_id: str, statuses: tuple[str, ...], timeout: float = JOB_TIMEOUT_S, tick=None) -> Job:
    def reached() -> Job | None:
        if tick is not None:
            tick()
        row = job(job_id)
        return row if row.status in statuses else None

    return wait_for(reached, timeout, f"job {job_id} to reach {statuses}", interval=0.2)


FINISHED = (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.EXPIRED)
