"""The batches' Celery tasks (api/batches/services.py), on the light worker: ``start_batch`` when
one is created, ``batch_progress`` when its jobs end, and ``tick_batches`` under beat. Their names
stay ``api.tasks.<name>`` (api/jobs/tasks.py says why)."""

from __future__ import annotations

from celery import shared_task

from api.batches import feed as batch_feed
from api.batches import services as batches
from api.batches.models import Batch, BatchStatus
from api.batches.selectors import batches_unfinished


@shared_task(name="api.tasks.start_batch", ignore_result=True)
def start_batch(batch_id: str) -> bool:
    """Turn a new batch's lines into its jobs and send the first of them to the engine (here: a
    message to another task would only add its latency)."""
    started = batches.batch_start(batch_id=batch_id)
    api_key_id = Batch.objects.filter(id=batch_id).values_list("api_key_id", flat=True).first()
    if started and api_key_id is not None:
        batch_feed.batch_feed(api_key_id=api_key_id)
    return started


@shared_task(name="api.tasks.batch_progress", ignore_result=True)
def batch_progress(api_key_id: int | None, batch_id: str) -> None:
    """Some of a batch's jobs ended, or it started or was cancelled: send the key's next jobs, and
    end the batch if none of its jobs is left to run."""
    if api_key_id is not None:
        batch_feed.batch_feed(api_key_id=api_key_id)
    batches.batch_advance(batch_id=batch_id)


@shared_task(name="api.tasks.tick_batches", ignore_result=True)
def tick_batches() -> int:
    """What the batches' messages do, for every batch that has not ended: the net under a lost
    message or a light worker that died in the middle of one. Returns how many it looked at."""
    unfinished = batches_unfinished()
    for batch_id, _key, status in unfinished:
        if status == BatchStatus.VALIDATING:
            batches.batch_start(batch_id=batch_id)
    for api_key_id in batch_feed.batch_keys_to_feed():
        batch_feed.batch_feed(api_key_id=api_key_id)
    for batch_id, _key, status in unfinished:
        if status != BatchStatus.VALIDATING:
            batches.batch_advance(batch_id=batch_id)
    return len(unfinished)
