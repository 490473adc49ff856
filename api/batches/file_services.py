"""Files: an upload checked and stored, a batch's output written, a file deleted with its bytes.

The bytes live in the ``files`` storage (settings.STORAGES: a folder under var/ by default, or any
backend of Django's storage API, such as S3 through django-storages). An upload reaches here as
Django's UploadedFile, which spills to a temporary file past FILE_UPLOAD_MAX_MEMORY_SIZE, and is
copied to the storage chunk by chunk: no upload is held in memory whole.
"""

from __future__ import annotations

import logging
from typing import IO

from django.conf import settings
from django.contrib.auth.models import User
from django.core.files import File as DjangoFile
from django.core.files.storage import Storage, storages
from django.db import transaction

from api.batches.file_selectors import file_get
from api.batches.lines import FileTooLarge, validate_file
from api.batches.models import BATCH_TERMINAL_STATUSES, Batch, File, FilePurpose
from api.common.errors import InvalidRequest, ServiceError

logger = logging.getLogger(__name__)


class FileInUse(ServiceError):
    status_code = 409
    code = "file_in_use"

    def __init__(self, file_id: str, batch_id: str) -> None:
        super().__init__(f"The file {file_id} is the input of batch {batch_id}, which has not ended; "
                         f"cancel the batch first.", param="file_id")


def files_storage() -> Storage:
    return storages["files"]


def file_create(*, owner: User, upload: DjangoFile, purpose: str) -> File:
    """Check ``upload`` as a batch input (api/batches/lines.py) and store it. Raises InvalidRequest
    for another purpose, FileTooLarge past FILES_MAX_BYTES or FILES_MAX_LINES, and FileInvalid
    naming its first bad lines."""
    if purpose != FilePurpose.BATCH:
        raise InvalidRequest(f"purpose must be \"{FilePurpose.BATCH}\" (the only purpose this service takes).",
                             param="purpose")
    if upload.size is not None and upload.size > settings.FILES_MAX_BYTES:
        raise FileTooLarge(f"The file is larger than {settings.FILES_MAX_BYTES} bytes.", param="file")
    upload.seek(0)
    lines = validate_file(upload, max_lines=settings.FILES_MAX_LINES)
    upload.seek(0)
    return _store(owner=owner, purpose=FilePurpose.BATCH, filename=upload.name or "batch.jsonl", content=upload,
                  size=upload.size or 0, lines=lines)


def file_create_output(*, owner: User, filename: str, content: IO[bytes], size: int, lines: int) -> File:
    """A batch's output or error file (already in OpenAI's line format)."""
    return _store(owner=owner, purpose=FilePurpose.BATCH_OUTPUT, filename=filename, content=DjangoFile(content),
                  size=size, lines=lines)


def _store(*, owner: User, purpose: str, filename: str, content: DjangoFile, size: int,
           lines: int) -> File:
    file = File(owner=owner, purpose=purpose, filename=filename[:255], bytes=size, lines=lines)
    storage = files_storage()
    file.storage_name = storage.save(f"{file.id}.jsonl", content)
    try:
        file.save(force_insert=True)
    except Exception:
        storage.delete(file.storage_name)  # no bytes without a row
        raise
    return file


def file_delete(*, file_id: str, owner: User) -> File:
    """Delete the owner's file and its bytes. Raises FileNotFound, or FileInUse for the input of a
    batch that has not ended (its lines are read again when it starts)."""
    file = file_get(file_id=file_id, owner=owner)
    active = Batch.objects.filter(input_file_id=file.id).exclude(status__in=BATCH_TERMINAL_STATUSES).first()
    if active is not None:
        raise FileInUse(file.id, active.id)
    with transaction.atomic():
        File.objects.filter(id=file.id).delete()
        transaction.on_commit(lambda: _delete_bytes(file.storage_name))
    return file


def _delete_bytes(name: str) -> None:
    try:
        files_storage().delete(name)
    except OSError:
        logger.exception("could not delete the bytes of a deleted file (%s)", name)
