"""``GET /metrics``: the service's Prometheus metrics (api/system/metrics.py).

A scraper authenticates with ``Authorization: Bearer <METRICS_TOKEN>``; a staff user's admin
session works too (to look at it in a browser). With no ``METRICS_TOKEN`` set, only staff can read
it: queue depths and worker names are the operator's, not the API users'.
"""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.common.errors import error_body
from api.keys.authentication import bearer_token
from api.system.metrics import registry


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not _allowed(request):
        response = JsonResponse(error_body("Send 'Authorization: Bearer <METRICS_TOKEN>' or sign in as staff.",
                                           error_type="invalid_request_error", code="metrics_forbidden"), status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


def _allowed(request: HttpRequest) -> bool:
    token = bearer_token(request.headers.get("Authorization", ""))
    if token and settings.METRICS_TOKEN:
        return hmac.compare_digest(token.encode(), settings.METRICS_TOKEN.encode())
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_active and user.is_staff)
