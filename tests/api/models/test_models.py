from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

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
