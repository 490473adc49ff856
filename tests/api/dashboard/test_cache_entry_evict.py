"""The admin's eviction of a prefix-cache entry: a staff-only, CSRF-checked POST publishes the
command on the worker's own channel; the worker's I/O thread hands it to its engine; the entry
leaves the worker's next heartbeat."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from django.test import Client

from api.common.redis_client import channel_db, get_redis
from api.common.redis_keys import worker_evict_channel
from api.serving.workers import worker_list
from tests.api.factories import heartbeat, make_user, publish_heartbeat
from tests.api.worker.live_worker import live_worker, wait_until

URL = "/admin/engine/cache/evict"
KEY = "07c1c96c835529d3562b0677"


@pytest.fixture
def staff(db) -> Client:
    client = Client()
    client.force_login(make_user(is_staff=True))
    return client


@pytest.fixture
def listening(redis_client):
    """A live heartbeat for worker w-1 and a subscriber on its command channel (as its I/O thread)."""
    publish_heartbeat(redis_client, heartbeat(worker_id="w-1"))
    pubsub = redis_client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(worker_evict_channel(channel_db(redis_client), "w-1"))
    yield pubsub
    pubsub.close()


def post(client: Client, body: dict, **extra) -> object:
    return client.post(URL, json.dumps(body), content_type="application/json", **extra)


def next_message(pubsub, timeout: float = 1.0) -> dict | None:
    """The next message published on the subscribed channel before this call, or None if there
    was none. A marker is published now: a subscriber gets a channel's messages in the order they
    were published, so anything the requests before this call published comes before the marker,
    and None needs no waiting. (get_message answers the subscription's confirmation with None:
    skipped, as are the markers of earlier calls.) ``timeout`` bounds the wait for the marker."""
    marker = {"marker": uuid.uuid4().hex}
    for channel in pubsub.channels:
        get_redis().publish(channel, json.dumps(marker))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.1)
        if message:
            body = json.loads(message["data"])
            if body == marker:
                return None
            if "marker" not in body:  # else an earlier call's marker
                return body
    raise AssertionError(f"the marker published on {list(pubsub.channels)} did not come back in {timeout} s")


def test_a_staff_evict_is_published_on_that_workers_own_channel(staff, listening):
    response = post(staff, {"worker_id": "w-1", "key": KEY})

    assert response.status_code == 202
    assert response.json() == {"worker_id": "w-1", "key": KEY, "status": "requested"}
    assert next_message(listening) == {"key": KEY}


def test_the_evict_post_needs_the_sessions_csrf_token(db, listening):
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user(is_staff=True))
    client.get("/admin/engine/")  # the page sets the CSRF cookie, as a browser's visit does

    refused = post(client, {"worker_id": "w-1", "key": KEY})
    accepted = post(client, {"worker_id": "w-1", "key": KEY}, HTTP_X_CSRFTOKEN=client.cookies["csrftoken"].value)

    assert refused.status_code == 403 and "CSRF" in refused.json()["error"]["message"]
    assert accepted.status_code == 202
    assert next_message(listening) == {"key": KEY}


def test_only_staff_may_evict(db, listening):
    user = Client()
    user.force_login(make_user())

    assert post(user, {"worker_id": "w-1", "key": KEY}).status_code == 403
    assert post(Client(), {"worker_id": "w-1", "key": KEY}).status_code in (401, 403)
    assert next_message(listening) is None


@pytest.mark.parametrize(("body", "param"), [
    ({"worker_id": "w-1"}, "key"),
    ({"worker_id": "w-1", "key": "../../etc"}, "key"),
    ({"worker_id": "w-1", "key": "AB" * 40}, "key"),
    ({"key": KEY}, "worker_id"),
])
def test_a_malformed_evict_is_a_400_naming_the_field(staff, listening, body, param):
    response = post(staff, body)

    assert response.status_code == 400
    assert response.json()["error"]["param"] == param
    assert next_message(listening) is None


def test_an_evict_for_a_worker_without_a_heartbeat_is_a_404(staff, redis_client):
    response = post(staff, {"worker_id": "w-gone", "key": KEY})

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "worker_not_found"


def test_an_evict_nobody_hears_is_a_503_to_retry(staff, redis_client):
    publish_heartbeat(redis_client, heartbeat(worker_id="w-deaf"))

    response = post(staff, {"worker_id": "w-deaf", "key": KEY})

    assert response.status_code == 503
    assert "retry" in response.json()["error"]["message"]


def test_an_evicted_entry_leaves_the_live_workers_next_heartbeat(
    staff, transactional_db, redis_client, tiny_model, consumer_connections_closed
):
    with live_worker(tiny_model, redis_client, worker_id="w-evict") as worker:
        worker.run_shared_prefix_jobs(3)
        stored = len(worker.engine.list_cache_entries())
        assert stored >= 2
        entries = wait_until(lambda: [w.cache_entries for w in worker_list() if len(w.cache_entries) == stored])[0]
        key = entries[0]["key_hash"]

        response = post(staff, {"worker_id": "w-evict", "key": key})

        assert response.status_code == 202
        wait_until(lambda: key not in [row["key_hash"] for row in worker_list()[0].cache_entries], timeout=5)
        assert key not in [row["key_hash"] for row in worker.engine.list_cache_entries()]
        assert len(worker.engine.list_cache_entries()) == stored - 1
