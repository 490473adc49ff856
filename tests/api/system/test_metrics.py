"""GET /metrics: the service's Prometheus metrics, from the jobs' rows and the workers' heartbeats."""

from __future__ import annotations

from unittest import mock

import pytest
import redis
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from api.models import JobStatus
from tests.api.factories import heartbeat, make_job, make_user, publish_heartbeat

pytestmark = pytest.mark.django_db

TOKEN = "scrape-secret"
RUNNING = {"request_id": "j-1", "status": "running", "tokens_per_second": 41.5}
WAITING = {"request_id": "j-2", "status": "waiting", "tokens_per_second": None}


def _samples(response) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _scrape(client: Client | None = None, token: str | None = TOKEN):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return (client or Client()).get("/metrics", **headers)


def test_metrics_give_job_counts_and_each_workers_figures(settings, redis_client):
    settings.METRICS_TOKEN = TOKEN
    for status in (JobStatus.QUEUED, JobStatus.QUEUED, JobStatus.IN_PROGRESS, JobStatus.COMPLETED):
        make_job(status=status)
    publish_heartbeat(redis_client, heartbeat(worker_id="gpu-1", requests=(RUNNING, WAITING), num_waiting=1,
                                              cache={"hit_rate": 0.25, "entries": 7, "enabled": True, "by": {}}))

    response = _scrape()

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    samples = _samples(response)
    assert samples[("inference_jobs", (("status", "queued"),))] == 2
    assert samples[("inference_jobs", (("status", "in_progress"),))] == 1
    assert samples[("inference_jobs", (("status", "failed"),))] == 0
    assert samples[("inference_workers", ())] == 1
    assert samples[("inference_worker_info", (("device", "cpu"), ("model", "tiny"), ("worker", "gpu-1")))] == 1
    assert samples[("inference_worker_requests", (("state", "running"), ("worker", "gpu-1")))] == 2
    assert samples[("inference_worker_requests", (("state", "waiting"), ("worker", "gpu-1")))] == 1
    assert samples[("inference_worker_memory_bytes", (("kind", "peak"), ("worker", "gpu-1")))] == 20 << 20
    assert samples[("inference_worker_memory_bytes", (("kind", "budget"), ("worker", "gpu-1")))] == 1 << 30
    assert samples[("inference_worker_memory_bytes", (("kind", "kv"), ("worker", "gpu-1")))] == 3 << 20
    assert samples[("inference_worker_tokens_per_second", (("worker", "gpu-1"),))] == 41.5
    assert samples[("inference_worker_cache", (("stat", "hit_rate"), ("worker", "gpu-1")))] == 0.25
    assert samples[("inference_worker_cache", (("stat", "entries"), ("worker", "gpu-1")))] == 7
    assert not any(name == "inference_worker_cache" and dict(labels)["stat"] in ("enabled", "by")
                   for name, labels in samples)
    assert 0 <= samples[("inference_worker_heartbeat_age_seconds", (("worker", "gpu-1"),))] < 5
    assert samples[("inference_component_up", (("component", "database"),))] == 1
    assert samples[("inference_component_up", (("component", "redis"),))] == 1


def test_with_redis_down_the_job_figures_still_come_and_redis_reads_as_down(settings, redis_client):
    settings.METRICS_TOKEN = TOKEN
    make_job(status=JobStatus.QUEUED)

    with mock.patch("api.system.metrics.worker_list", side_effect=redis.ConnectionError("down")):
        response = _scrape()

    samples = _samples(response)
    assert response.status_code == 200
    assert samples[("inference_component_up", (("component", "redis"),))] == 0
    assert samples[("inference_jobs", (("status", "queued"),))] == 1
    assert ("inference_workers", ()) not in samples


def test_metrics_need_the_token_or_a_staff_session(settings, redis_client):
    settings.METRICS_TOKEN = TOKEN
    staff, member = Client(), Client()
    staff.force_login(make_user(is_staff=True))
    member.force_login(make_user())

    assert _scrape(token=None).status_code == 401
    assert _scrape(token="wrong").status_code == 401
    assert _scrape(member, token=None).status_code == 401
    assert _scrape(staff, token=None).status_code == 200
    assert _scrape(token=TOKEN).status_code == 200
    refused = _scrape(token=None)
    assert refused.json()["error"]["code"] == "metrics_forbidden"
    assert refused["WWW-Authenticate"].startswith("Bearer")


def test_with_no_token_configured_a_bearer_token_is_not_enough(settings, redis_client):
    settings.METRICS_TOKEN = ""

    assert _scrape(token="anything").status_code == 401
    assert _scrape(token="").status_code == 401
