"""The key lookup behind every request: one prepared statement, the ORM's instances."""

from __future__ import annotations

import pytest
from django.forms.models import model_to_dict
from django.utils import timezone

from api.models import ApiKey
from api.selectors.api_keys import api_key_with_owner
from api.services.api_keys import api_key_revoke, hash_secret
from tests.api.factories import make_api_key, make_user

pytestmark = pytest.mark.django_db


def test_the_key_and_its_owner_equal_what_the_orm_loads():
    owner = make_user(first_name="Ada", is_staff=True)
    key, secret = make_api_key(owner=owner, name="ci", requests_per_minute=7)
    owner.last_login = timezone.now()
    owner.save()

    found = api_key_with_owner(hashed_key=hash_secret(secret))
    orm = ApiKey.objects.select_related("owner").get(id=key.id)

    assert model_to_dict(found) == model_to_dict(orm)
    assert model_to_dict(found.owner) == model_to_dict(orm.owner)
    assert found.owner.last_login == orm.owner.last_login and timezone.is_aware(found.owner.last_login)
    assert not found._state.adding and found._state.db == "default"
    found.name = "renamed"
    found.save(update_fields=["name"])  # a normal model instance
    assert ApiKey.objects.get(id=key.id).name == "renamed"


def test_an_unknown_hash_finds_nothing_and_a_revoked_key_is_returned_as_revoked():
    key, secret = make_api_key()
    assert api_key_with_owner(hashed_key=hash_secret("sk-nope")) is None
    api_key_revoke(api_key_id=key.id)
    assert api_key_with_owner(hashed_key=hash_secret(secret)).revoked_at is not None
