"""The staff-only engine dashboard (wrapped in admin_view in the URLconf)."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from api.selectors.dashboard import REQUEST_FIELDS, engine_overview


def engine_dashboard(request: HttpRequest) -> HttpResponse:
    context = {
        **admin.site.each_context(request),
        "title": "Engine dashboard",
        "request_fields": REQUEST_FIELDS,
        "initial": engine_overview(),
    }
    return render(request, "admin/engine_dashboard.html", context)


def engine_dashboard_data(request: HttpRequest) -> JsonResponse:
    return JsonResponse(engine_overview())
