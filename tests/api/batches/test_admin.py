"""The admin of files and batches: a batch's progress bar, the cancel action, and files deleted
with their bytes."""

from __future__ import annotations

import pytest
from django.contrib.admin.utils import quote
from django.core.files.storage import storages
from django.test import Client
from django.urls import reverse

from api.batches.file_services import file_create
from api.batches.models import Batch, BatchStatus, File
from api.batches.services import batch_create, batch_start
from api.models import Job, JobStatus
from tests.api.batches.helpers import chat_line, finish, upload
from tests.api.factories import make_api_key, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def files_dir(settings, tmp_path):
    settings.STORAGES = {**settings.STORAGES, "files": {
        "BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "files")}}}


@pytest.fixture
def staff() -> Client:
    client = Client()
    client.force_login(make_user(is_staff=True, is_superuser=True))
    return client


def _started_batch(lines: int) -> Batch:
    api_key, _ = make_api_key()
    file = file_create(owner=api_key.owner, upload=upload([chat_line(str(i)) for i in range(lines)]), purpose="batch")
    batch = batch_create(owner=api_key.owner, api_key=api_key, input_file_id=file.id,
                         endpoint="/v1/chat/completions", completion_window="24h")
    batch_start(batch_id=batch.id)
    return batch


def test_the_batch_list_shows_each_batchs_progress(staff, broker):
    batch = _started_batch(4)
    finish(Job.objects.filter(batch=batch).first())

    page = staff.get("/admin/api/batch/").content.decode()

    assert batch.id in page and '<progress value="1" max="4"' in page and "1/4" in page
    # The admin quotes a primary key in its URLs ("_" is its escape character: "batch_23..." would
    # name "batch#...").
    assert staff.get(reverse("admin:api_batch_change", args=[quote(batch.id)])).status_code == 200


def test_the_cancel_action_cancels_the_selected_batches(staff, broker):
    batch = _started_batch(2)

    staff.post("/admin/api/batch/", {"action": "cancel_batches", "_selected_action": [batch.id]})

    assert Batch.objects.get(id=batch.id).status == BatchStatus.CANCELLING
    assert set(Job.objects.filter(batch=batch).values_list("status", flat=True)) == {JobStatus.CANCELLED}


def test_the_delete_action_deletes_files_with_their_bytes(staff, django_capture_on_commit_callbacks):
    owner = make_user()
    file = file_create(owner=owner, upload=upload([chat_line("a")]), purpose="batch")

    with django_capture_on_commit_callbacks(execute=True):
        staff.post("/admin/api/file/", {"action": "delete_files", "_selected_action": [file.id]})

    assert not File.objects.filter(id=file.id).exists() and not storages["files"].exists(file.storage_name)
    assert staff.get("/admin/api/file/").status_code == 200
