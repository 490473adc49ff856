"""The staff-only engine dashboard: its page and JSON (wrapped in admin_view in the URLconf), and
the eviction of a prefix-cache entry (staff sessions, CSRF-checked)."""

from __future__ import annotations

import math

from django.contrib import admin
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.authentication import SessionAuthentication
from rest_framework.permissions import IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.common.errors import error_body
from api.dashboard.selectors import engine_overview
from api.dashboard.services import cache_entry_evict


def engine_dashboard(request: HttpRequest) -> HttpResponse:
    context = {
        **admin.site.each_context(request),
        "title": "Engine Dashboard",
        "initial": engine_overview(),
    }
    return render(request, "admin/engine_dashboard.html", context)


def engine_dashboard_data(request: HttpRequest) -> JsonResponse:
    """The dashboard's snapshot; ``?since=<unix time>`` limits the charts' samples to later ones."""
    raw = request.GET.get("since")
    since = None
    if raw is not None:
        try:
            since = float(raw)
        except ValueError:
            since = math.nan
        if not math.isfinite(since):
            return JsonResponse(error_body("since must be a unix time in seconds.", error_type="invalid_request_error",
                                           code="invalid", param="since"), status=400)
    return JsonResponse(engine_overview(since=since))


class CacheEntryEvictSerializer(serializers.Serializer):
    worker_id = serializers.CharField(max_length=255)
    # A cache entry's key_hash (hex), or a paged cache's block id (decimal).
    key = serializers.RegexField(r"^[0-9a-f]{1,64}$", error_messages={
        "invalid": "key must be the key_hash of one of the worker's cache entries."})


class CacheEntryEvictView(APIView):
    """POST ``{"worker_id", "key"}``: the worker drops that prefix-cache entry (202; its next
    heartbeat no longer lists it). The admin's session authenticates, with its CSRF token."""

    authentication_classes = [SessionAuthentication]
    permission_classes = [IsAdminUser]

    @extend_schema(exclude=True)  # the admin's, not the API's
    def post(self, request: Request) -> Response:
        body = CacheEntryEvictSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        cache_entry_evict(**body.validated_data)
        return Response({**body.validated_data, "status": "requested"}, status=202)
