"""Reads of batches: the owner's by id, a page of them (OpenAI's cursor paging), and their
request counts while they run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from django.contrib.auth.models import User
from django.db.models import Count, Q, QuerySet

from api.batches.models import BATCH_RUNNING_STATUSES, Batch, BatchStatus, File
from api.common.errors import ServiceError
from api.models import JobStatus

T = TypeVar("T", Batch, File)  # the rows paged by creation time


class BatchNotFound(ServiceError):
    status_code = 404
    code = "batch_not_found"

    def __init__(self, batch_id: object, *, param: str = "batch_id") -> None:
        super().__init__(f"No batch with id {batch_id}.", param=param)


def batch_get(*, batch_id: str, owner: User) -> Batch:
    """The owner's batch, or BatchNotFound (another user's batch is not found either)."""
    batch = with_request_counts(Batch.objects.filter(id=batch_id, owner=owner)).first()
    if batch is None:
        raise BatchNotFound(batch_id)
    return batch


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    has_more: bool


def page_after(rows: QuerySet[T], *, after: T | None, limit: int, newest_first: bool = True) -> Page[T]:
    """``limit`` rows of ``rows`` (ordered by creation, then id) that come after ``after``."""
    if after is not None:
        if newest_first:
            rows = rows.filter(Q(created_at__lt=after.created_at) | Q(created_at=after.created_at, id__lt=after.pk))
        else:
            rows = rows.filter(Q(created_at__gt=after.created_at) | Q(created_at=after.created_at, id__gt=after.pk))
    ordered = rows.order_by(*(("-created_at", "-id") if newest_first else ("created_at", "id")))
    items = list(ordered[:limit + 1])
    return Page(items[:limit], len(items) > limit)


def batch_list(*, owner: User, after: str | None, limit: int) -> Page[Batch]:
    """A page of the owner's batches, newest first, after the batch ``after`` (BatchNotFound if
    it is not the owner's)."""
    cursor = Batch.objects.filter(id=after, owner=owner).first() if after else None
    if after and cursor is None:
        raise BatchNotFound(after, param="after")
    return page_after(with_request_counts(Batch.objects.filter(owner=owner)), after=cursor, limit=limit)


def with_request_counts(rows: QuerySet[Batch]) -> QuerySet[Batch]:
    """``rows`` with their jobs counted, as :func:`batch_request_counts` reads them."""
    return rows.annotate(jobs_total=Count("jobs"), jobs_completed=Count("jobs", filter=Q(jobs__status=JobStatus.COMPLETED)),
                         jobs_failed=Count("jobs", filter=Q(jobs__status__in=(JobStatus.FAILED, JobStatus.CANCELLED,
                                                                               JobStatus.EXPIRED))))


def batch_request_counts(batch: Batch) -> dict[str, int]:
    """OpenAI's ``request_counts``: as stored when the batch ended, else counted from its jobs
    (a batch read through :func:`batch_get` or :func:`batch_list` has them counted)."""
    if batch.request_counts is not None:
        return batch.request_counts
    if not hasattr(batch, "jobs_total"):
        batch = with_request_counts(Batch.objects.filter(id=batch.id)).get()
    counts = vars(batch)  # the annotations of with_request_counts
    return {"total": counts["jobs_total"], "completed": counts["jobs_completed"], "failed": counts["jobs_failed"]}


def batches_unfinished() -> list[tuple[str, int | None, str]]:
    """(id, key id, status) of the batches that have not ended, oldest first."""
    rows = Batch.objects.filter(status__in=(*BATCH_RUNNING_STATUSES, BatchStatus.VALIDATING)).order_by("created_at")
    return list(rows.values_list("id", "api_key_id", "status"))
