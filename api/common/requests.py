"""The request type of the views behind API-key authentication, for their annotations."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rest_framework.request import Request

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from api.models import ApiKey

    class AuthenticatedRequest(Request):
        """``request.user`` and ``request.auth`` once ``ApiKeyAuthentication`` passed (the default
        permission, ``IsAuthenticated``, lets no other request reach a view): the key's owner and
        the key."""

        user: User
        auth: ApiKey
else:
    AuthenticatedRequest = Request
