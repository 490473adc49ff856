"""The engine dashboard's page and its JSON, staff-only."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from django.test import Client

from api.models import JobStatus
from api.worker.history import HistorySample, history_record
from tests.api.factories import heartbeat, make_job, make_user, publish_heartbeat

pytestmark = pytest.mark.django_db

RUNNING = {
    "request_id": "job-1", "status": "running", "phase": "decode", "elapsed_s": 1.5, "prompt_tokens": 12,
    "completion_tokens": 30, "max_tokens": 64, "progress": 0.47, "tokens_per_second": 21.5, "ttft_s": 0.08,
    "cache_hit_type": "prefix", "cached_tokens": 8,
}



@pytest.fixture
def staff():
    client = Client()
    client.force_login(make_user(is_staff=True, is_superuser=True))
    return client


def test_engine_dashboard_is_staff_only(redis_client):
    client = Client()
    client.force_login(make_user())

    page = client.get("/admin/engine/")
    data = client.get("/admin/engine/data.json")

    assert page.status_code == 302 and "/admin/login/" in page["Location"]
    assert data.status_code == 302


def test_engine_dashboard_page_embeds_the_snapshot_and_loads_its_scripts_from_this_server(staff, redis_client):
    entry = {"key_hash": "07c1c96c835529d3562b0677", "tokens": 128, "bytes": 4096, "tier": "ram", "hit_count": 3,
             "last_used": 1.0, "quantized": False}
    publish_heartbeat(redis_client, heartbeat(worker_id="mac-1", requests=(RUNNING,), cache={"hit_rate": 0.5},
                                              cache_entries=(entry,)))

    html = staff.get("/admin/engine/").content.decode()

    for text in ("Engine Dashboard", "mac-1", "job-1", "07c1c96c835529d3562b0677", "Queue Depth (jobs)",
                 "Generation Speed (tokens/s)", "Evict Prefix-Cache Entry?", "csrfmiddlewaretoken",
                 "/static/api/engine_dashboard.js", "/static/api/dashboard_charts.js"):
        assert text in html
    assert "src=\"http" not in html and "href=\"http" not in html  # nothing from a CDN: it may run offline


def test_engine_dashboard_data_has_the_running_request_fields_memory_cache_and_throughput(staff, redis_client):
    publish_heartbeat(redis_client, heartbeat(worker_id="mac-1", requests=(RUNNING,), cache={"hit_rate": 0.5}))
    now = time.time()
    for t, generated in ((now - 4, 1000), (now - 2, 2530)):
        history_record(redis_client, worker_id="mac-1", heartbeat_s=2.0,
                       sample=HistorySample(t=t, generated_tokens=generated, active_bytes=1, peak_bytes=2,
                                            cache_bytes=3, limit_bytes=4, running=1, waiting=0, queued=0))
    make_job(status=JobStatus.IN_PROGRESS)

    data = staff.get("/admin/engine/data.json").json()

    assert [w["worker_id"] for w in data["workers"]] == ["mac-1"]
    assert data["workers"][0]["memory"] == {"device": "cpu", "active_bytes": 10 << 20, "peak_bytes": 20 << 20,
                                            "cache_bytes": 5 << 20, "budget_bytes": 1 << 30,
                                            "weights_bytes": 4 << 20, "kv_bytes": 3 << 20,
                                            "prefix_cache_bytes": 2 << 20, "limit_bytes": 0}
    assert data["workers"][0]["cache"] == {"hit_rate": 0.5}
    assert data["workers"][0]["cache_entries"] == []
    assert data["requests"] == [{"worker_id": "mac-1", **RUNNING}]
    assert data["jobs"]["in_progress"] == 1
    # The engines' speed is the rate of their generated-token counters, not the finished jobs'.
    assert data["throughput"]["engine_tokens_per_second"] == data["workers"][0]["tokens_per_second"] == 765.0
    assert [p["tokens_per_second"] for p in data["history"]["mac-1"]] == [None, 765.0]
    assert data["history_s"] == 600


def test_engine_dashboard_data_sends_only_the_samples_after_since(staff, redis_client):
    publish_heartbeat(redis_client, heartbeat(worker_id="mac-1"))
    now = time.time()
    for t in (now - 6, now - 4, now - 2):
        history_record(redis_client, worker_id="mac-1", heartbeat_s=2.0,
                       sample=HistorySample(t=t, generated_tokens=0, active_bytes=1, peak_bytes=2, cache_bytes=3,
                                            limit_bytes=4, running=0, waiting=0, queued=0))

    data = staff.get(f"/admin/engine/data.json?since={now - 5}").json()
    bad = staff.get("/admin/engine/data.json?since=yesterday")

    assert [p["t"] for p in data["history"]["mac-1"]] == [now - 4, now - 2]
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "since"


def test_the_running_jobs_card_counts_what_the_worker_panel_shows(staff, redis_client):
    """The card and the workers' rows read the same heartbeats: 20 jobs in_progress in the
    database (some claimed and waiting, some of a dead worker) are not 15 running in the engines."""
    publish_heartbeat(redis_client, heartbeat(worker_id="mac-1", num_running=9, num_waiting=3))
    publish_heartbeat(redis_client, heartbeat(worker_id="mac-2", num_running=6, num_waiting=2))
    for _ in range(20):
        make_job(status=JobStatus.IN_PROGRESS)

    data = staff.get("/admin/engine/data.json").json()

    assert data["engines"] == {"running": 15, "waiting": 5}
    assert data["engines"]["running"] == sum(w["num_running"] for w in data["workers"])
    assert data["jobs"]["in_progress"] == 20
    script = (Path(__file__).resolve().parents[3] / "api/static/api/engine_dashboard.js").read_text()
    assert 'card("Running Jobs", U.count(d.engines.running))' in script
