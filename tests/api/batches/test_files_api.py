"""``/v1/files``: upload (checked line by line, stored in the files storage), list, read, content
and delete, each user seeing only their own files."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.files.storage import storages
from rest_framework.test import APIClient

from api.batches.models import File
from tests.api.batches.helpers import chat_line, jsonl, upload
from tests.api.factories import make_api_key


@pytest.fixture(autouse=True)
def files_dir(settings, tmp_path) -> Path:
    settings.STORAGES = {**settings.STORAGES, "files": {
        "BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "files")}}}
    return tmp_path / "files"


def _upload(client: APIClient, lines: list, purpose: str = "batch"):
    return client.post("/v1/files", {"file": upload(lines), "purpose": purpose}, format="multipart")


def test_an_upload_is_stored_and_answered_as_openais_file_object(api_client, files_dir):
    response = _upload(api_client, [chat_line("a"), chat_line("b")])

    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["id"].startswith("file-") and body["object"] == "file" and body["purpose"] == "batch"
    assert (body["filename"], body["bytes"], body["status"]) == ("input.jsonl", len(jsonl([chat_line("a"), chat_line("b")])),
                                                                 "processed")
    file = File.objects.get(id=body["id"])
    assert file.lines == 2 and (files_dir / file.storage_name).read_bytes() == jsonl([chat_line("a"), chat_line("b")])


def test_a_file_with_bad_lines_is_a_400_naming_them_and_nothing_is_stored(api_client, files_dir):
    response = _upload(api_client, [chat_line("a"), {**chat_line("b"), "method": "GET"}, chat_line("a")])

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_file" and error["param"] == "file"
    assert "line 2: method" in error["message"] and "line 3: custom_id 'a' is not unique" in error["message"]
    assert not File.objects.exists() and not any(files_dir.glob("*"))


def test_the_upload_limits_are_settings(api_client, settings):
    settings.FILES_MAX_LINES = 1
    assert _upload(api_client, [chat_line("a"), chat_line("b")]).status_code == 413
    settings.FILES_MAX_LINES, settings.FILES_MAX_BYTES = 100, 10
    response = _upload(api_client, [chat_line("a")])
    assert response.status_code == 413 and response.json()["error"]["code"] == "file_too_large"


def test_another_purpose_or_no_file_is_a_400(api_client):
    assert _upload(api_client, [chat_line("a")], purpose="fine-tune").json()["error"]["param"] == "purpose"
    response = api_client.post("/v1/files", {"purpose": "batch"}, format="multipart")
    assert response.status_code == 400 and response.json()["error"]["param"] == "file"


def test_files_are_listed_read_and_downloaded_by_their_owner_only(api_client, redis_client):
    first = _upload(api_client, [chat_line("a")]).json()
    second = _upload(api_client, [chat_line("b")]).json()
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {make_api_key()[1]}")

    listed = api_client.get("/v1/files").json()
    assert [f["id"] for f in listed["data"]] == [second["id"], first["id"]] and listed["has_more"] is False
    page = api_client.get("/v1/files", {"limit": 1, "order": "asc"}).json()
    assert [f["id"] for f in page["data"]] == [first["id"]] and page["has_more"] is True
    assert api_client.get("/v1/files", {"after": first["id"], "order": "asc"}).json()["data"][0]["id"] == second["id"]
    assert api_client.get(f"/v1/files/{first['id']}").json() == first
    content = api_client.get(f"/v1/files/{first['id']}/content")
    assert content.status_code == 200 and b"".join(content) == jsonl([chat_line("a")])

    assert other.get("/v1/files").json()["data"] == []
    for response in (other.get(f"/v1/files/{first['id']}"), other.get(f"/v1/files/{first['id']}/content"),
                     other.delete(f"/v1/files/{first['id']}")):
        assert response.status_code == 404 and response.json()["error"]["code"] == "file_not_found"


def test_delete_removes_the_row_and_the_bytes(api_client, files_dir, django_capture_on_commit_callbacks):
    file_id = _upload(api_client, [chat_line("a")]).json()["id"]
    name = File.objects.get(id=file_id).storage_name

    with django_capture_on_commit_callbacks(execute=True):
        response = api_client.delete(f"/v1/files/{file_id}")

    assert response.json() == {"id": file_id, "object": "file", "deleted": True}
    assert not File.objects.filter(id=file_id).exists() and not storages["files"].exists(name)
    assert api_client.get(f"/v1/files/{file_id}").status_code == 404
