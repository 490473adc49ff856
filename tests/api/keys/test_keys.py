"""/api/v1/keys: a user lists their own API keys and revokes one without an operator."""

from __future__ import annotations

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from api.models import ApiKey
from tests.api.factories import make_api_key

pytestmark = pytest.mark.django_db


def client_for(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def test_the_list_holds_only_the_callers_keys_newest_first_without_secrets(api_client, api_key):
    second, _ = make_api_key(owner=api_key.owner, name="ci", requests_per_minute=7, priority=20)
    revoked, _ = make_api_key(owner=api_key.owner, name="old")
    revoked.revoked_at = timezone.now()
    revoked.save()
    make_api_key(name="someone else's")

    response = api_client.get("/api/v1/keys")

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["count"] == 3
    rows = body["results"]
    assert [r["id"] for r in rows] == [revoked.id, second.id, api_key.id]
    assert [(r["active"], r["current"]) for r in rows] == [(False, False), (True, False), (True, True)]
    assert rows[0]["revoked_at"] is not None and rows[1]["revoked_at"] is None
    assert rows[1]["prefix"] == second.prefix and rows[1]["name"] == "ci" and rows[1]["object"] == "api_key"
    assert rows[1]["quotas"] == {"requests_per_minute": 7, "tokens_per_day": second.tokens_per_day,
                                 "max_concurrent_jobs": second.max_concurrent_jobs,
                                 "max_tokens_per_job": second.max_tokens_per_job, "priority": 20}
    text = response.content.decode()
    assert "hashed_key" not in text and second.hashed_key not in text


def test_the_list_pages_and_a_bad_page_size_is_400(api_client, api_key):
    for i in range(3):
        make_api_key(owner=api_key.owner, name=f"k{i}")

    page = api_client.get("/api/v1/keys?page_size=2").json()
    assert page["count"] == 4 and len(page["results"]) == 2 and page["next"]

    response = api_client.get("/api/v1/keys?page_size=51")
    assert response.status_code == 400 and response.json()["error"]["param"] == "page_size"


def test_a_revoked_key_is_refused_from_the_next_request_on(api_client, api_key):
    other, other_secret = make_api_key(owner=api_key.owner, name="leaked")
    assert client_for(other_secret).get("/api/v1/jobs").status_code == 200

    response = api_client.post(f"/api/v1/keys/{other.id}/revoke")

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["id"] == other.id and body["active"] is False and body["revoked_at"] is not None
    refused = client_for(other_secret).get("/api/v1/jobs")
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "revoked_api_key"
    assert api_client.get("/api/v1/jobs").status_code == 200  # the caller's own key still works


def test_revoking_twice_keeps_the_first_revocation_time(api_client, api_key):
    other, _ = make_api_key(owner=api_key.owner)
    first = api_client.post(f"/api/v1/keys/{other.id}/revoke").json()["revoked_at"]

    again = api_client.post(f"/api/v1/keys/{other.id}/revoke")

    assert again.status_code == 200 and again.json()["revoked_at"] == first


def test_a_key_may_revoke_itself_and_is_refused_afterwards(api_client, api_key):
    response = api_client.post(f"/api/v1/keys/{api_key.id}/revoke")

    assert response.status_code == 200 and response.json()["current"] is True
    assert ApiKey.objects.get(id=api_key.id).revoked_at is not None
    assert api_client.get("/api/v1/keys").status_code == 401


@pytest.mark.parametrize("key_id", ["another user's", 10**6, 10**20])
def test_another_users_or_an_unknown_key_is_404_and_stays_active(api_client, key_id):
    others_key, _ = make_api_key(name="not yours")
    target = others_key.id if key_id == "another user's" else key_id

    response = api_client.post(f"/api/v1/keys/{target}/revoke")

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "api_key_not_found"
    assert ApiKey.objects.get(id=others_key.id).revoked_at is None


def test_keys_need_a_valid_key(db, redis_client):
    assert APIClient().get("/api/v1/keys").status_code == 401
    assert client_for("sk-not-a-key").post("/api/v1/keys/1/revoke").status_code == 401


def test_the_key_endpoints_are_in_the_schema(db):
    paths = APIClient().get("/api/v1/schema").json()["paths"]

    assert "get" in paths["/api/v1/keys"] and "post" in paths["/api/v1/keys/{key_id}/revoke"]
    assert "post" not in paths["/api/v1/keys"]  # keys are created by operators, not over the API
