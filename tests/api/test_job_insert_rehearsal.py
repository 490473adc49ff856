"""job_insert_rehearsal: a submission's database call, run and rolled back, so the backend behind
a connection has compiled and planned it before a client's job arrives (PostgreSQL)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone

from api.models import ApiKey, Job
from api.services.job_insert import REHEARSALS, job_insert_rehearsal, job_insert_within_quota
from api.streaming.queue_listener import CHANNEL, django_connect
from tests.api.factories import make_api_key

postgresql_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="the one-call submission is PostgreSQL's")

# This backend's compiled PL/pgSQL functions and the plans it keeps for the gate's usage query.
_WARM_STATE_SQL = """
SELECT name, ident FROM pg_backend_memory_contexts
WHERE (name = 'PL/pgSQL function' AND ident IN ('api_key_gate(bigint,uuid,timestamp with time zone,date)',
                                                'api_job_queued_notify()'))
   OR (name = 'CachedPlanSource' AND ident LIKE '%FROM api_job j%')
"""


def _warm_state() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(_WARM_STATE_SQL)
        return {"gate's usage query" if name == "CachedPlanSource" else ident.split("(")[0]
                for name, ident in cursor.fetchall()}


@postgresql_only
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("with_a_user", [True, False], ids=["foreign keys checked", "no user to own it"])
def test_the_rehearsal_warms_this_backend_and_leaves_nothing_behind(with_a_user):
    if with_a_user:
        make_api_key()  # a user (and a key) exist: the rehearsal's foreign keys are checked at once
    connection.close()  # a backend that has run no submission yet
    connection.ensure_connection()
    assert _warm_state() == set()
    keys, users = ApiKey.objects.count(), get_user_model().objects.count()
    with django_connect() as listener:
        listener.execute(f"LISTEN {CHANNEL}")

        assert job_insert_rehearsal() is True

        # A real INSERT notifies at its commit; the rehearsal's were rolled back, so none came.
        assert sum(1 for _ in listener.notifies(timeout=0.5, stop_after=1)) == 0
    assert _warm_state() == {"api_key_gate", "api_job_queued_notify", "gate's usage query"}
    assert not Job.objects.exists()
    assert (ApiKey.objects.count(), get_user_model().objects.count()) == (keys, users)
    assert connection.get_autocommit() and not connection.in_atomic_block


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_real_submission_on_the_rehearsed_connection_is_committed_and_counted():
    api_key, _ = make_api_key(max_concurrent_jobs=1)
    assert job_insert_rehearsal() is True
    job = Job(owner=api_key.owner, api_key=api_key, prompt="hi", prompt_token_ids=[1, 2], params={"max_tokens": 4},
              priority=api_key.priority, request_fingerprint="f" * 64, dispatch_count=1)

    position, usage = job_insert_within_quota(job, now=timezone.now())

    # The rehearsals' jobs never counted: this is the key's first and only active job.
    assert (position, usage.active_jobs, usage.exceeded()) == (0, 1, False)
    assert Job.objects.filter(id=job.id).exists()


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_the_rehearsal_runs_often_enough_for_the_gate_to_keep_a_generic_plan():
    # PostgreSQL plans a PL/pgSQL statement anew for its first five runs on a backend.
    assert REHEARSALS > 5
    connection.close()
    connection.ensure_connection()
    job_insert_rehearsal()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_backend_memory_contexts "
                       "WHERE name = 'CachedPlan' AND ident LIKE '%FROM api_job j%'")
        assert cursor.fetchone()[0] == 1


@pytest.mark.django_db(transaction=True)
def test_there_is_nothing_to_rehearse_where_the_submission_is_not_one_call(monkeypatch):
    import api.services.job_insert as job_insert

    monkeypatch.setattr(job_insert, "can_insert_within_quota", lambda using="default": False)  # SQLite, say
    assert job_insert_rehearsal() is False
    assert not Job.objects.exists() and not ApiKey.objects.exists()
