from __future__ import annotations

import hashlib
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone
from rest_framework.test import APIClient

from api.common.errors import AuthenticationFailed
from api.keys.authentication import authenticate_api_key
from api.keys.services import api_key_revoke
from api.models import ApiKey
from tests.api.factories import make_api_key, make_user

pytestmark = pytest.mark.django_db


def test_only_the_hash_and_a_visible_prefix_of_the_secret_are_stored():
    api_key, secret = make_api_key()

    stored = ApiKey.objects.get(id=api_key.id)
    assert stored.hashed_key == hashlib.sha256(secret.encode()).hexdigest()
    assert secret.startswith(stored.prefix) and len(stored.prefix) < len(secret)
    assert secret not in {getattr(stored, f.attname) for f in ApiKey._meta.fields if isinstance(getattr(stored, f.attname), str)}


def test_a_user_may_have_many_keys_and_each_authenticates_as_that_user():
    user = make_user()
    (first, s1), (second, s2) = make_api_key(owner=user), make_api_key(owner=user)

    assert authenticate_api_key(s1) == first and authenticate_api_key(s2) == second
    assert first.owner == second.owner == user


@pytest.mark.parametrize(
    ("header", "code"),
    [(None, "missing_api_key"), ("Bearer sk-not-a-key", "invalid_api_key"), ("Basic abc", "invalid_api_key"),
     ("Bearer", "invalid_api_key")],
)
def test_missing_or_bad_key_is_401_in_the_envelope(db, redis_client, header, code):
    client = APIClient()
    if header is not None:
        client.credentials(HTTP_AUTHORIZATION=header)

    response = client.get("/api/v1/jobs")

    assert response.status_code == 401
    assert response.json()["error"]["code"] == code
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_revoked_key_is_401_and_other_keys_keep_working(redis_client):
    api_key, secret = make_api_key()
    _, other_secret = make_api_key(owner=api_key.owner)
    assert api_key_revoke(api_key_id=api_key.id) is True
    client = APIClient()

    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    revoked = client.get("/api/v1/jobs")
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {other_secret}")
    other = client.get("/api/v1/jobs")

    assert revoked.status_code == 401 and revoked.json()["error"]["code"] == "revoked_api_key"
    assert other.status_code == 200


def test_revoking_twice_reports_nothing_to_do():
    api_key, _ = make_api_key()
    assert api_key_revoke(api_key_id=api_key.id) is True
    assert api_key_revoke(api_key_id=api_key.id) is False


def test_key_of_an_inactive_user_is_rejected():
    api_key, secret = make_api_key(owner=make_user(is_active=False))
    with pytest.raises(AuthenticationFailed):
        authenticate_api_key(secret)


def test_using_a_key_records_last_used_at_at_most_once_a_minute():
    api_key, secret = make_api_key()
    assert api_key.last_used_at is None

    authenticate_api_key(secret)
    first = ApiKey.objects.get(id=api_key.id).last_used_at
    authenticate_api_key(secret)
    second = ApiKey.objects.get(id=api_key.id).last_used_at
    ApiKey.objects.filter(id=api_key.id).update(last_used_at=timezone.now() - timedelta(minutes=5))
    authenticate_api_key(secret)
    third = ApiKey.objects.get(id=api_key.id).last_used_at

    assert first is not None and second == first
    assert third > timezone.now() - timedelta(minutes=1)


def test_create_api_user_command_prints_a_working_key():
    out = StringIO()
    call_command("create_api_user", "demo", "--staff", "--password", "pw", stdout=out)

    secret = out.getvalue().strip().splitlines()[-1]
    api_key = authenticate_api_key(secret)
    assert api_key.owner.username == "demo" and api_key.owner.is_staff
    assert api_key.owner.check_password("pw")


def test_create_api_user_twice_adds_a_second_key_to_the_same_user():
    call_command("create_api_user", "demo", "--quiet", stdout=StringIO())
    call_command("create_api_user", "demo", "--quiet", stdout=StringIO())

    assert ApiKey.objects.filter(owner__username="demo").count() == 2


def test_create_api_user_with_replace_revokes_the_earlier_key_of_that_name_only(redis_client):
    def mint(*args: str) -> str:
        out = StringIO()
        call_command("create_api_user", "demo", "--quiet", *args, stdout=out)
        return out.getvalue().strip()

    other = mint("--key-name", "ci")
    first = mint("--key-name", "make run", "--replace")
    second = mint("--key-name", "make run", "--replace")

    assert authenticate_api_key(second).name == "make run"
    assert authenticate_api_key(other).name == "ci"
    with pytest.raises(AuthenticationFailed):
        authenticate_api_key(first)
    assert ApiKey.objects.filter(owner__username="demo", name="make run", revoked_at__isnull=True).count() == 1


def test_a_jobs_websocket_learns_the_key_and_whether_the_job_is_its_owners_in_one_query(django_assert_num_queries):
    from api.keys.authentication import authenticate_api_key_for_job
    from tests.api.factories import make_job

    api_key, secret = make_api_key()
    other_key, other_secret = make_api_key()
    mine, theirs = make_job(api_key=api_key), make_job(api_key=other_key)
    authenticate_api_key(secret)  # records last_used_at (an UPDATE) once; the rest is the lookup

    with django_assert_num_queries(1):
        assert authenticate_api_key_for_job(secret, str(mine.id)) == (api_key, True)
    assert authenticate_api_key_for_job(secret, str(theirs.id)) == (api_key, False)
    assert authenticate_api_key_for_job(secret, "00000000-0000-0000-0000-000000000000") == (api_key, False)
    assert authenticate_api_key_for_job(secret, "not-a-uuid") == (api_key, False)
    key, owns = authenticate_api_key_for_job(other_secret, str(theirs.id))
    assert (key, owns, key.owner) == (other_key, True, other_key.owner)

    for raw, code in ((None, "missing_api_key"), ("sk-not-a-key", "invalid_api_key")):
        with pytest.raises(AuthenticationFailed) as failed:
            authenticate_api_key_for_job(raw, str(mine.id))
        assert failed.value.code == code
    api_key_revoke(api_key_id=api_key.id)
    with pytest.raises(AuthenticationFailed) as failed:
        authenticate_api_key_for_job(secret, str(mine.id))
    assert failed.value.code == "revoked_api_key"
