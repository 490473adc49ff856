"""What one POST /api/v1/jobs costs in database statements and Redis round trips: pinned, so that
the submission path does not grow unnoticed (each one is paid by every job, at every load)."""

from __future__ import annotations

import pytest
import redis
from django.db import connection
from django.test.utils import CaptureQueriesContext

pytestmark = pytest.mark.django_db(transaction=True)

BODY = {"prompt": "Hello", "max_tokens": 1}


@pytest.fixture
def redis_round_trips(monkeypatch) -> list[bytes]:
    """Every packet this process sends to Redis from here on (a pipeline is one)."""
    sent: list[bytes] = []
    send = redis.connection.Connection.send_packed_command

    def counted(self, command, check_health=True):
        sent.append(command if isinstance(command, bytes | str) else b"".join(command))
        return send(self, command, check_health)

    monkeypatch.setattr(redis.connection.Connection, "send_packed_command", counted)
    return sent


def test_a_submission_costs_seven_statements_one_redis_round_trip_and_one_dispatch(api_client, dispatched,
                                                                                   redis_round_trips):
    assert api_client.post("/api/v1/jobs", BODY, format="json").status_code == 202  # warms the per-process caches
    redis_round_trips.clear()

    with CaptureQueriesContext(connection) as queries:
        response = api_client.post("/api/v1/jobs", BODY, format="json")

    assert response.status_code == 202
    statements = [query["sql"].split()[0] for query in queries.captured_queries]
    # The key with its owner; the quota hold (lock, count, hold: one statement of its own
    # transaction); the job's transaction (its hold out, the job in); the queue position.
    assert statements == ["SELECT", "SELECT", "BEGIN", "DELETE", "INSERT", "COMMIT", "SELECT"], queries.captured_queries
    assert "api_quota_hold" in queries.captured_queries[1]["sql"]
    assert len(redis_round_trips) == 1 and b"INCRBY" in redis_round_trips[0]  # the request rate, one pipeline
    assert len(dispatched) == 2
