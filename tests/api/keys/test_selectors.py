"""The key lookup behind every request and every stream's connect."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from api.keys.selectors import api_key_with_owner, api_key_with_owner_and_job
from api.keys.services import api_key_revoke, hash_secret
from tests.api.factories import make_api_key, make_job, make_user

pytestmark = pytest.mark.django_db


def test_the_key_comes_with_its_owner_in_one_query():
    key, secret = make_api_key(owner=make_user(first_name="Ada"))

    with CaptureQueriesContext(connection) as queries:
        found = api_key_with_owner(hashed_key=hash_secret(secret))
        assert (found.id, found.owner.first_name) == (key.id, "Ada")

    assert len(queries) == 1


def test_an_unknown_hash_finds_nothing_and_a_revoked_key_is_returned_as_revoked():
    key, secret = make_api_key()
    assert api_key_with_owner(hashed_key=hash_secret("sk-nope")) is None
    api_key_revoke(api_key_id=key.id)
    assert api_key_with_owner(hashed_key=hash_secret(secret)).revoked_at is not None


def test_a_streams_connect_learns_the_key_and_whether_the_job_is_its_owners_in_one_query():
    key, secret = make_api_key()
    own, foreign = make_job(owner=key.owner), make_job()
    deleted = make_job(owner=key.owner, deleted_at=timezone.now())

    with CaptureQueriesContext(connection) as queries:
        found, owns = api_key_with_owner_and_job(hashed_key=hash_secret(secret), job_id=str(own.id))
        assert (found.id, found.owner.id, owns) == (key.id, key.owner.id, True)
    assert len(queries) == 1

    for job_id in (foreign.id, deleted.id, uuid.uuid4(), "not-a-uuid"):
        found, owns = api_key_with_owner_and_job(hashed_key=hash_secret(secret), job_id=str(job_id))
        assert found.id == key.id and owns is False
    assert api_key_with_owner_and_job(hashed_key=hash_secret("sk-nope"), job_id=str(own.id)) == (None, False)
