"""Webhook signatures are the Standard Webhooks spec's: its published test vector, the reference
library's verifier, and a verifier written from the spec's text."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from api.models import WEBHOOK_SECRET_PREFIX, new_webhook_secret
from api.webhooks.signing import webhook_headers

# The spec's example (https://github.com/standard-webhooks/standard-webhooks, spec/standard-webhooks.md).
SPEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SPEC_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SPEC_TIMESTAMP = 1614265330
SPEC_BODY = '{"test": 2432232314}'
SPEC_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def verify_by_hand(secret: str, headers: dict[str, str], body: str) -> bool:
    """The spec's verification: HMAC-SHA256 over "{id}.{timestamp}.{body}" with the secret's
    base64-decoded bytes, compared with each ``v1,`` signature of the header."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.{body}".encode()
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(version == "v1" and hmac.compare_digest(signature, expected)
               for version, _, signature in (s.partition(",") for s in headers["webhook-signature"].split(" ")))


def test_signature_matches_the_specs_test_vector():
    at = dt.datetime.fromtimestamp(SPEC_TIMESTAMP, tz=dt.UTC)
    headers = webhook_headers(secret=SPEC_SECRET, message_id=SPEC_ID, body=SPEC_BODY, at=at)
    assert headers["webhook-id"] == SPEC_ID
    assert headers["webhook-timestamp"] == str(SPEC_TIMESTAMP)
    assert headers["webhook-signature"] == SPEC_SIGNATURE


def test_a_fresh_signature_verifies_with_the_reference_library_and_by_hand():
    secret = new_webhook_secret()
    body = '{"type":"job.completed","data":{"id":"x","output_text":"caf\\u00e9"}}'
    headers = webhook_headers(secret=secret, message_id="job_1_2", body=body, at=dt.datetime.now(dt.UTC))
    assert Webhook(secret).verify(body, headers)["type"] == "job.completed"
    assert verify_by_hand(secret, headers, body)
    with pytest.raises(WebhookVerificationError):
        Webhook(new_webhook_secret()).verify(body, headers)  # another key's secret
    assert not verify_by_hand(secret, headers, body.replace("x", "y"))  # a changed body


def test_a_new_secret_is_whsec_and_32_random_bytes():
    secrets = {new_webhook_secret() for _ in range(3)}
    assert len(secrets) == 3
    for secret in secrets:
        assert secret.startswith(WEBHOOK_SECRET_PREFIX)
        assert len(base64.b64decode(secret.removeprefix(WEBHOOK_SECRET_PREFIX))) == 32
