"""Files and batches in OpenAI's shapes (``object`` "file", "batch", "list"), and the paging
parameters of their lists."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from django.http import QueryDict
from drf_spectacular.utils import OpenApiParameter

from api.batches.models import Batch, File
from api.batches.selectors import Page, batch_request_counts
from api.common.errors import InvalidRequest

T = TypeVar("T", Batch, File)


def _unix(value: dt.datetime | None) -> int | None:
    return None if value is None else int(value.timestamp())


def file_object(file: File) -> dict[str, Any]:
    return {"id": file.id, "object": "file", "bytes": file.bytes, "created_at": _unix(file.created_at),
            "filename": file.filename, "purpose": file.purpose, "status": "processed", "status_details": None,
            "expires_at": None}


def batch_object(batch: Batch) -> dict[str, Any]:
    return {
        "id": batch.id, "object": "batch", "endpoint": batch.endpoint, "errors": batch.errors,
        "input_file_id": batch.input_file_id, "completion_window": batch.completion_window,
        "status": batch.status, "output_file_id": batch.output_file_id, "error_file_id": batch.error_file_id,
        "created_at": _unix(batch.created_at), "in_progress_at": _unix(batch.in_progress_at),
        "expires_at": _unix(batch.expires_at), "finalizing_at": _unix(batch.finalizing_at),
        "completed_at": _unix(batch.completed_at), "failed_at": _unix(batch.failed_at),
        "expired_at": _unix(batch.expired_at), "cancelling_at": _unix(batch.cancelling_at),
        "cancelled_at": _unix(batch.cancelled_at), "request_counts": batch_request_counts(batch),
        "metadata": batch.metadata, "model": batch.model or None,
    }


def list_object(page: Page[T], render: Callable[[T], dict[str, Any]]) -> dict[str, Any]:
    data = [render(item) for item in page.items]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": page.has_more}


def query_limit(query: QueryDict, *, default: int, maximum: int) -> int:
    raw = query.get("limit")
    if raw in (None, ""):
        return default
    try:
        limit = int(raw)
    except ValueError:
        limit = 0
    if not 1 <= limit <= maximum:
        raise InvalidRequest(f"limit must be an integer from 1 to {maximum}.", param="limit")
    return limit


def query_choice(query: QueryDict, name: str, choices: Sequence[str], default: str) -> str:
    value = query.get(name) or default
    if value not in choices:
        raise InvalidRequest(f"{name} must be one of {', '.join(choices)}.", param=name)
    return value


def paging_parameters(maximum: int) -> list[OpenApiParameter]:
    return [OpenApiParameter("limit", int, description=f"1 to {maximum}"),
            OpenApiParameter("after", str, description="The last id of the previous page")]

