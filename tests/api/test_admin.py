from __future__ import annotations

import pytest
from django.test import Client

from api.common import redis_keys
from api.keys.authentication import authenticate_api_key
from api.models import ApiKey, Job, JobStatus
from tests.api.factories import make_api_key, make_job, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff():
    client = Client()
    client.force_login(make_user(is_staff=True, is_superuser=True))
    return client


def test_admin_pages_for_keys_jobs_usage_and_users_load(staff):
    api_key, _ = make_api_key()
    job = make_job(api_key=api_key, status=JobStatus.COMPLETED)
    for url in ("/admin/", "/admin/api/apikey/", f"/admin/api/apikey/{api_key.id}/change/", "/admin/api/job/",
                f"/admin/api/job/{job.id}/change/", "/admin/api/usagerecord/", "/admin/auth/user/"):
        assert staff.get(url).status_code == 200, url
    assert b"Engine dashboard" in staff.get("/admin/").content


def test_adding_a_key_in_the_admin_shows_the_secret_once_and_stores_its_hash(staff):
    owner = make_user()
    response = staff.post("/admin/api/apikey/add/", {
        "owner": owner.id, "name": "ops", "requests_per_minute": 60, "tokens_per_day": 1000,
        "max_concurrent_jobs": 2, "max_tokens_per_job": 100, "priority": 3,
    }, follow=True)

    message = next(str(m) for m in response.context["messages"] if "sk-" in str(m))
    secret = message.rsplit(" ", 1)[-1]
    assert authenticate_api_key(secret).owner == owner
    assert ApiKey.objects.get(owner=owner).max_concurrent_jobs == 2


def test_an_operator_restricts_a_key_to_some_models_in_the_admin(staff, settings, tiny_model_path):
    settings.MODELS = [("tiny", str(tiny_model_path)), ("tiny-b", str(tiny_model_path))]
    api_key, _secret = make_api_key()
    url = f"/admin/api/apikey/{api_key.id}/change/"
    page = staff.get(url).content.decode()
    assert 'value="tiny"' in page and 'value="tiny-b"' in page  # the configured models, as checkboxes

    fields = {"owner": api_key.owner.id, "name": "ops", "requests_per_minute": 60, "tokens_per_day": 1000,
              "max_concurrent_jobs": 2, "max_tokens_per_job": 100, "priority": 3}
    staff.post(url, {**fields, "allowed_models": ["tiny-b"]})
    assert ApiKey.objects.get(id=api_key.id).allowed_models == ["tiny-b"]

    staff.post(url, fields)  # none ticked: every model
    assert ApiKey.objects.get(id=api_key.id).allowed_models == []


def test_revoke_action_revokes_the_selected_keys(staff):
    api_key, _ = make_api_key()
    staff.post("/admin/api/apikey/", {"action": "revoke_keys", "_selected_action": [api_key.id]})
    assert ApiKey.objects.get(id=api_key.id).revoked_at is not None


def test_cancel_action_cancels_a_queued_job(staff, redis_client):
    job = make_job()
    staff.post("/admin/api/job/", {"action": "cancel_jobs", "_selected_action": [job.id]})
    assert Job.objects.get(id=job.id).status == JobStatus.CANCELLED


def test_requeue_action_resets_a_failed_job_and_dispatches_it_after_commit(
    staff, redis_client, dispatched, django_capture_on_commit_callbacks
):
    job = make_job(status=JobStatus.FAILED, error="boom", output_text="par", completion_tokens=3, worker_id="w",
                   prompt_tokens=0)  # the engine failed it before counting its prompt
    redis_client.xadd(redis_keys.job_stream_key(str(job.id)), {"seq": 1, "text": "par"})

    with django_capture_on_commit_callbacks(execute=True):
        staff.post("/admin/api/job/", {"action": "requeue_jobs", "_selected_action": [job.id]})

    job.refresh_from_db()
    assert (job.status, job.error, job.output_text, job.completion_tokens, job.worker_id) == ("queued", None, "", 0, None)
    assert job.prompt_tokens == len(job.prompt_token_ids)  # queued again with its prompt counted
    assert dispatched == [str(job.id)]
    assert redis_client.exists(redis_keys.job_stream_key(str(job.id))) == 0


def test_requeue_action_leaves_running_jobs_alone(staff, dispatched):
    job = make_job(status=JobStatus.IN_PROGRESS)
    response = staff.post("/admin/api/job/", {"action": "requeue_jobs", "_selected_action": [job.id]}, follow=True)
    assert Job.objects.get(id=job.id).status == JobStatus.IN_PROGRESS
    assert any("cannot be requeued" in str(m) for m in response.context["messages"])


def test_delete_content_action_clears_finished_jobs_and_keeps_their_counts(staff, redis_client):
    done = make_job(status=JobStatus.COMPLETED, output_text="private", completion_tokens=5, metadata={"a": "b"})
    running = make_job(status=JobStatus.IN_PROGRESS, worker_id="w")

    response = staff.post("/admin/api/job/", {"action": "delete_job_content", "_selected_action": [done.id, running.id]},
                          follow=True)

    done.refresh_from_db()
    assert (done.prompt, done.output_text, done.metadata, done.completion_tokens) == ("", "", {}, 5)
    assert done.deleted_at is not None
    assert Job.objects.get(id=running.id).prompt == "Once upon a time"  # still running: left alone, and said so
    assert any("cancel it first" in str(m) for m in response.context["messages"])


def test_user_admin_lists_the_users_keys(staff):
    api_key, _ = make_api_key()
    html = staff.get(f"/admin/auth/user/{api_key.owner.id}/change/").content.decode()
    assert api_key.prefix in html
