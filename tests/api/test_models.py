from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from api.common import redis_keys
from api.models import JobStatus
from tests.api.factories import make_job

pytestmark = pytest.mark.django_db


def test_ttft_and_rate_are_unknown_before_the_first_token():
    job = make_job()
    assert job.ttft_ms is None and job.tokens_per_second() is None


def test_rate_of_a_running_job_is_measured_until_now():
    t0 = timezone.now() - timedelta(seconds=2)
    job = make_job(status=JobStatus.IN_PROGRESS, queued_at=t0, first_token_at=t0, completion_tokens=21)

    assert job.tokens_per_second(now=t0 + timedelta(seconds=4)) == pytest.approx(5.0)
    assert job.ttft_ms == 0.0


def test_usage_totals_prompt_and_completion_tokens():
    job = make_job(prompt_tokens=7, completion_tokens=5, cached_tokens=3)
    assert job.total_tokens == 12 and job.max_tokens == 16


def test_redis_names_shared_with_the_worker_are_stable():
    job_id = "8b4f0f3e-0000-4000-8000-000000000000"
    assert redis_keys.job_stream_key(job_id) == f"job:{job_id}:chunks"
    assert redis_keys.worker_heartbeat_key("w-1") == "engine:workers:w-1"
    assert redis_keys.CANCEL_CHANNEL == "engine:cancel"
    assert (redis_keys.JOB_STREAM_FIELD_SEQ, redis_keys.JOB_STREAM_FIELD_TEXT) == ("seq", "text")
