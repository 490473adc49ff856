from __future__ import annotations

import re
from unittest import mock

import pytest
import redis
from openapi_spec_validator import OpenAPIV30SpecValidator
from rest_framework.test import APIClient

from api.common import redis_keys
from tests.api.factories import heartbeat, publish_heartbeat

pytestmark = pytest.mark.django_db


def test_models_lists_each_model_with_the_live_workers_serving_it(api_client, redis_client):
    publish_heartbeat(redis_client, heartbeat(worker_id="w-2", model="tiny"))
    publish_heartbeat(redis_client, heartbeat(worker_id="w-1", model="tiny"))
    publish_heartbeat(redis_client, heartbeat(worker_id="w-3", model="other"))
    redis_client.set(redis_keys.worker_heartbeat_key("broken"), "{not json", ex=10)

    body = api_client.get("/api/v1/models").json()

    assert body["object"] == "list"
    # The configured model first; a model a worker serves but jobs cannot name, after it.
    assert [(m["id"], m["configured"], m["available"]) for m in body["data"]] == [
        ("tiny", True, True), ("other", False, True)]
    tiny = body["data"][0]
    assert [w["worker_id"] for w in tiny["workers"]] == ["w-1", "w-2"]
    assert tiny["context_length"] == 4096 and tiny["workers"][0]["device"] == "cpu"
    assert tiny["workers"][0]["load"] == tiny["workers"][0]["num_running"] + tiny["workers"][0]["num_waiting"]


def test_models_lists_a_configured_model_without_a_live_worker_as_unavailable(api_client, redis_client):
    assert api_client.get("/api/v1/models").json()["data"] == [
        {"id": "tiny", "object": "model", "context_length": 4096, "configured": True, "available": False,
         "workers": []}]


def test_models_requires_an_api_key(db):
    assert APIClient().get("/api/v1/models").status_code == 401


def test_health_is_200_when_database_redis_and_a_worker_are_up(db, redis_client):
    publish_heartbeat(redis_client, heartbeat())

    response = APIClient().get("/api/v1/health")

    assert response.status_code == 200
    assert response.json() == {
        "status": "ok",
        "checks": {"database": {"ok": True}, "redis": {"ok": True},
                   "workers": {"ok": True, "live": 1, "models": {"tiny": {"live": 1, "served": True}}}},
    }


def test_health_is_503_without_a_live_worker(db, redis_client):
    response = APIClient().get("/api/v1/health")

    assert response.status_code == 503
    assert response.json()["checks"]["workers"] == {"ok": False, "live": 0,
                                                    "models": {"tiny": {"live": 0, "served": False}}}


def test_health_is_503_when_redis_is_unreachable(db, redis_client):
    broken = mock.Mock()
    broken.ping.side_effect = redis.ConnectionError("down")
    with mock.patch("api.system.views.get_redis", return_value=broken):
        response = APIClient().get("/api/v1/health")

    assert response.status_code == 503
    assert response.json()["checks"]["redis"] == {"ok": False, "error": "ConnectionError"}


def test_openapi_schema_is_served_as_json_without_authentication(db):
    response = APIClient().get("/api/v1/schema")

    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    assert {"/api/v1/jobs", "/api/v1/jobs/{job_id}", "/api/v1/jobs/{job_id}/cancel", "/api/v1/models",
            "/api/v1/health"} <= set(schema["paths"])
    assert "prompt" in schema["components"]["schemas"]["JobCreateRequest"]["properties"]


def test_the_served_schema_is_valid_openapi_3_0_so_client_generators_accept_it(db):
    """What the schema declares (3.0.x) is what its every part must follow: a 3.1-style numeric
    ``exclusiveMinimum`` in the OpenAI bodies made code generators and schemathesis reject it."""
    schema = APIClient().get("/api/v1/schema").json()
    assert schema["openapi"].startswith("3.0.")

    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in OpenAPIV30SpecValidator(schema).iter_errors()]

    assert errors == []
    top_p = schema["paths"]["/v1/completions"]["post"]["requestBody"]["content"]["application/json"][
        "schema"]["properties"]["top_p"]
    assert (top_p["minimum"], top_p["exclusiveMinimum"], top_p["maximum"]) == (0, True, 1)


def test_the_schema_and_docs_page_include_the_event_stream_that_no_drf_view_declares(db):
    schema = APIClient().get("/api/v1/schema").json()
    events = schema["paths"]["/api/v1/jobs/{job_id}/events"]["get"]
    assert set(events["responses"]) == {"200", "204", "400", "401", "404", "503"}
    assert "text/event-stream" in events["responses"]["200"]["content"]
    assert {p["name"] for p in events["parameters"]} == {"job_id", "after", "Last-Event-ID", "api_key"}
    html = APIClient().get("/api/v1/docs").content.decode()
    assert "/api/v1/jobs/{job_id}/events" in html and "Last-Event-ID" in html


def test_docs_page_renders_every_endpoint_and_loads_nothing_from_the_network(db):
    response = APIClient().get("/api/v1/docs")

    assert response.status_code == 200 and response["Content-Type"].startswith("text/html")
    html = response.content.decode()
    assert "/api/v1/jobs/{job_id}/cancel" in html and "JobCreateRequest" in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)


def test_favicon_is_an_icon_and_the_admin_pages_name_it(admin_client):
    response = admin_client.get("/favicon.ico")
    page = admin_client.get("/admin/").content.decode()

    assert response.status_code == 200 and response["Content-Type"] == "image/x-icon"
    assert response.content[:4] == b"\x00\x00\x01\x00"  # an ICO header
    assert '<link rel="icon" href="/static/api/favicon.ico">' in page
