"""Reads of files: the owner's, by id or newest first, and their bytes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import IO

from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.core.files.storage import storages
from django.db.models import QuerySet

from api.batches.models import File
from api.common.errors import ServiceError

CHUNK_BYTES = 64 * 1024


class FileNotFound(ServiceError):
    status_code = 404
    code = "file_not_found"

    def __init__(self, file_id: object, *, param: str = "file_id") -> None:
        super().__init__(f"No file with id {file_id}.", param=param)


def file_get(*, file_id: str, owner: User, param: str = "file_id") -> File:
    """The owner's file, or FileNotFound (another user's file is not found either)."""
    file = File.objects.filter(id=file_id, owner=owner).first()
    if file is None:
        raise FileNotFound(file_id, param=param)
    return file


def file_list(*, owner: User, purpose: str | None = None) -> QuerySet[File]:
    files = File.objects.filter(owner=owner)
    return files.filter(purpose=purpose) if purpose else files


def file_open(*, file: File) -> IO[bytes]:
    return storages["files"].open(file.storage_name, "rb")


async def file_chunks(handle: IO[bytes]) -> AsyncIterator[bytes]:
    """The bytes of an open file, read off the event loop a chunk at a time (Django serves a
    synchronous iterator under ASGI only by reading it whole first)."""
    read = sync_to_async(handle.read, thread_sensitive=False)
    try:
        while chunk := await read(CHUNK_BYTES):
            yield chunk
    finally:
        await sync_to_async(handle.close, thread_sensitive=False)()
