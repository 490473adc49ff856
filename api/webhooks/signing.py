"""Webhook signatures, as the Standard Webhooks specification defines them
(https://www.standardwebhooks.com): ``webhook-signature: v1,<base64 HMAC-SHA256 of
"{webhook-id}.{webhook-timestamp}.{body}">`` keyed with the secret ``whsec_<base64>`` of the API
key. The HMAC is the ``standardwebhooks`` package's, whose verifier receivers can use as is."""

from __future__ import annotations

import datetime as dt

from standardwebhooks.webhooks import Webhook


def webhook_headers(*, secret: str, message_id: str, body: str, at: dt.datetime) -> dict[str, str]:
    """The headers of one attempt at sending ``body`` as message ``message_id``, signed at ``at``
    (an aware datetime; the spec's timestamp is whole seconds since the epoch)."""
    at = at.astimezone(dt.UTC)
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": Webhook(secret).sign(message_id, at, body),
        "content-type": "application/json",
    }
